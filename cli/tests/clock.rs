//! `ictus clock-server` and `ictus clock` as processes: registration with the name
//! server, the control socket, a client in this process setting an alarm, a clean stop
//! on `SIGTERM`, and the errors when nothing runs.
//!
//! No test asserts a duration; waits are bounded by a watchdog only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ictus_clock_server::{AlarmMessage, Client};
use ictus_ipc::{ReceiveOptions, Received, Space};
use ictus_rt::When;

const WATCHDOG: Duration = Duration::from_secs(30);

fn ictus() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ictus"))
}

/// A directory of its own for each test, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "ictus-clock-cli-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process that is killed if the test ends before it does.
struct Proc(Child);

impl Proc {
    fn spawn(cmd: &mut Command) -> Proc {
        Proc(cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap())
    }

    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.0.id();
        let ok = Command::new("sh").arg("-c").arg(format!("kill -TERM {pid}")).status().unwrap().success();
        assert!(ok, "kill -TERM {pid}");
        let deadline = Instant::now() + WATCHDOG;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "watchdog: the process did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WATCHDOG;
    while !cond() {
        assert!(Instant::now() < deadline, "watchdog: still waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap()
}

fn names(ns: &Path) -> String {
    String::from_utf8(run(ictus().arg("names").arg("--socket").arg(ns)).stdout).unwrap()
}

#[test]
fn clock_server_registers_serves_and_stops() {
    let dir = TempDir::new();
    let ns_sock = dir.0.join("ns.sock");
    let ctl = dir.0.join("ctl.sock");
    let ns = Proc::spawn(ictus().arg("name-server").arg("--socket").arg(&ns_sock));
    // Listening, not merely bound: `ictus names` succeeds.
    wait_until("the name server to answer", || {
        run(ictus().arg("names").arg("--socket").arg(&ns_sock)).status.success()
    });
    let clock =
        Proc::spawn(ictus().arg("clock-server").arg("--name-server").arg(&ns_sock).arg("--control-socket").arg(&ctl));
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
    let dir = TempDir::new();
    let out = run(ictus()
        .arg("clock-server")
        .arg("--name-server")
        .arg(dir.0.join("nobody.sock"))
        .arg("--control-socket")
        .arg(dir.0.join("ctl.sock")));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("start `ictus name-server` first"), "{err}");
    assert!(!dir.0.join("ctl.sock").exists(), "nothing left behind");
}
