//! `ictus clock-server` and `ictus clock` as processes: registration with the name
//! server, the control socket, a client in this process setting an alarm, a clean stop
//! on `SIGTERM`, and the errors when nothing runs.
//!
//! No test asserts a duration; waits are bounded by a watchdog only.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use ictus_clock_server::{AlarmMessage, Client};
use ictus_ipc::{ReceiveOptions, Received, Space};
use ictus_rt::When;
use ictus_testkit::{wait_until, Proc, TempDir, WATCHDOG};

fn ictus() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ictus"))
}

/// `ictus ARGS…` as a child, its standard streams closed.
fn spawn(what: &str, cmd: &mut Command) -> Proc {
    Proc::spawn(what, cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()))
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap()
}

fn names(ns: &Path) -> String {
    String::from_utf8(run(ictus().arg("names").arg("--socket").arg(ns)).stdout).unwrap()
}

#[test]
fn clock_server_registers_serves_and_stops() {
    let dir = TempDir::new("clock-cli");
    let ns_sock = dir.join("ns.sock");
    let ctl = dir.join("ctl.sock");
    let mut ns = spawn("ictus name-server", ictus().arg("name-server").arg("--socket").arg(&ns_sock));
    // Listening, not merely bound: `ictus names` succeeds.
    wait_until("the name server to answer", || {
        run(ictus().arg("names").arg("--socket").arg(&ns_sock)).status.success()
    });
    let mut clock = spawn(
        "ictus clock-server",
        ictus().arg("clock-server").arg("--name-server").arg(&ns_sock).arg("--control-socket").arg(&ctl),
    );
    wait_until("the clock to be registered", || names(&ns_sock).lines().any(|l| l == "clock"));

    let now = run(ictus().args(["clock", "--name-server"]).arg(&ns_sock).arg("now"));
    assert!(now.status.success(), "{now:?}");
    assert!(String::from_utf8_lossy(&now.stdout).contains("since boot"), "{now:?}");
    let set = run(ictus().args(["clock", "--control-socket"]).arg(&ctl).args(["set-resolution", "0"]));
    assert!(set.status.success(), "{set:?}");

    // A client of the real server, in this process.
    let space = Space::new();
    let client = Client::connect_socket(&space, &ns_sock).unwrap().with_timeout(WATCHDOG);
    let port = space.allocate_port().unwrap();
    client.set_alarm(When::After(Duration::from_millis(1)), port, 77).unwrap();
    let mut r = Received::new();
    space.receive(port, &mut r, ReceiveOptions { timeout: Some(WATCHDOG), ..Default::default() }).unwrap();
    assert_eq!(AlarmMessage::parse(&r).unwrap().tag, 77);
    let stats = run(ictus().args(["clock", "--control-socket"]).arg(&ctl).arg("stats"));
    let text = String::from_utf8_lossy(&stats.stdout).into_owned();
    assert!(text.contains("alarms sent 1") && text.contains("client quota 256"), "{text}");

    assert!(clock.terminate().success(), "a clean stop on SIGTERM");
    assert!(!ctl.exists(), "the control socket is removed");
    assert!(!names(&ns_sock).lines().any(|l| l == "clock"), "the registration went with the port");
    let gone = run(ictus().args(["clock", "--control-socket"]).arg(&ctl).arg("stats"));
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no clock server"), "{gone:?}");
    drop(client);
    assert!(ns.terminate().success());
}

#[test]
fn clock_server_without_a_name_server_says_so() {
    let dir = TempDir::new("clock-cli");
    let out = run(ictus()
        .arg("clock-server")
        .arg("--name-server")
        .arg(dir.join("nobody.sock"))
        .arg("--control-socket")
        .arg(dir.join("ctl.sock")));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("start `ictus name-server` first"), "{err}");
    assert!(!dir.join("ctl.sock").exists(), "nothing left behind");
}
