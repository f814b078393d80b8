//! The servers as system services, without a running systemd: socket activation by
//! `systemd-socket-activate` (Debian's `systemd` package; what systemd does for a
//! `.socket` unit: bind, listen, and on the first connection start the server with the
//! socket as descriptor 3, `LISTEN_FDS` and `LISTEN_PID`), and readiness notification
//! to a `NOTIFY_SOCKET` this test listens on (issue 21, item 4).
//!
//! What must hold: the client's first connect starts the server; the server says
//! `READY=1` (with its pid) and, when stopped, `STOPPING=1`; it leaves the socket,
//! which is the service manager's, in place; a server started by hand on the same
//! path refuses while the activated one runs; a second activation after the server
//! exits works, and one after a `kill -9` too (the server then knows it replaces one
//! that died); a socket of the wrong kind, or bound elsewhere, is refused with a clear
//! error. The units under `dist/systemd` start the servers this very way.

use std::ffi::OsStr;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ictus_testkit::{wait_until, Proc, TempDir, WATCHDOG};

fn ictus() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ictus"))
}

const ACTIVATE: &str = "systemd-socket-activate";

/// The notification socket a service manager would listen on.
struct Notifications {
    socket: UnixDatagram,
    path: PathBuf,
}

impl Notifications {
    fn new(dir: &TempDir) -> Notifications {
        let path = dir.join("notify");
        let socket = UnixDatagram::bind(&path).expect("bind the notification socket");
        socket.set_read_timeout(Some(WATCHDOG)).unwrap();
        Notifications { socket, path }
    }

    /// The next notification, within the watchdog.
    fn next(&self, what: &str) -> String {
        let mut buf = [0u8; 4096];
        match self.socket.recv(&mut buf) {
            Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
            Err(e) => panic!("watchdog: no notification ({what}): {e}"),
        }
    }

    /// Nothing is waiting now.
    fn none_waiting(&self) -> bool {
        self.socket.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 4096];
        let none = self.socket.recv(&mut buf).is_err();
        self.socket.set_nonblocking(false).unwrap();
        none
    }
}

/// `systemd-socket-activate --seqpacket -l SOCKET -E NOTIFY_SOCKET=… ictus ARGS…`,
/// its standard error (and the server's: it execs the server) in `log`.
fn activate(what: &str, socket: &Path, kind: &str, notify: &Path, args: &[&OsStr], log: &Path) -> Proc {
    let mut cmd = Command::new(ACTIVATE);
    if !kind.is_empty() {
        cmd.arg(kind);
    }
    cmd.arg("-l").arg(socket);
    cmd.arg("-E").arg(format!("NOTIFY_SOCKET={}", notify.display()));
    cmd.arg("-E").arg("RUST_LOG=info");
    cmd.arg(ictus()).args(args);
    let p = Proc::spawn_logged(what, &mut cmd, log);
    wait_until(&format!("{ACTIVATE} listening at {}", socket.display()), || p.log().contains("Listening on"));
    p
}

/// The program the process `pid` runs now (`/proc/PID/comm`, at most 15 bytes).
fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_owned()
}

/// `ictus names --socket PATH`: the first connect to an activated socket.
fn list_names(socket: &Path) -> std::process::Output {
    Command::new(ictus()).arg("names").arg("--socket").arg(socket).stdin(Stdio::null()).output().unwrap()
}

fn assert_activation_tool() {
    let found = Command::new(ACTIVATE).arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(found, "{ACTIVATE} is missing: install Debian's systemd package (scripts/setup.sh does)");
}

#[test]
fn the_first_connect_starts_the_name_server_which_says_ready_and_leaves_the_socket() {
    assert_activation_tool();
    let dir = TempDir::new("svc-name");
    let socket = dir.join("name-server.sock");
    let lock = dir.join("name-server.sock.lock");
    let notes = Notifications::new(&dir);
    let args = [OsStr::new("name-server"), OsStr::new("--socket"), socket.as_os_str()];

    for round in ["first", "second"] {
        let mut server =
            activate("the activated name server", &socket, "--seqpacket", &notes.path, &args, &dir.join(round));
        // Nothing runs the server yet: the service manager holds the socket.
        assert!(comm(server.pid()).starts_with("systemd-socket"), "{round}: {} before a connect", comm(server.pid()));
        assert!(notes.none_waiting(), "{round}: a notification before the server started");
        // The first connect starts it; the connection waits in the backlog meanwhile.
        let out = list_names(&socket);
        assert!(
            out.status.success(),
            "{round}: ictus names: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            server.log()
        );
        let ready = notes.next("READY=1");
        assert!(ready.lines().any(|l| l == "READY=1"), "{round}: {ready:?}");
        assert!(ready.lines().any(|l| l == format!("MAINPID={}", server.pid())), "{round}: {ready:?}");
        assert_eq!(comm(server.pid()), "ictus", "{round}: the server replaced the activator");
        // A server started by hand on the same path refuses: the lock is held.
        let hand = Command::new(ictus()).args(args).stdin(Stdio::null()).output().unwrap();
        assert!(!hand.status.success(), "{round}: a second server started beside the activated one");
        assert!(String::from_utf8_lossy(&hand.stderr).contains("already running"), "{round}: {hand:?}");
        // Stopped as systemd stops it: SIGTERM.
        let st = server.terminate();
        assert!(st.success(), "{round}: {st}\n{}", server.log());
        assert!(notes.next("STOPPING=1").lines().any(|l| l == "STOPPING=1"));
        assert!(server.log().contains("socket from the service manager"), "{}", server.log());
        // The socket is the service manager's: still there. The lock file is gone.
        assert!(std::fs::symlink_metadata(&socket).is_ok(), "{round}: the server removed the manager's socket");
        assert!(std::fs::symlink_metadata(&lock).is_err(), "{round}: the lock file stayed after a clean stop");
    }

    // Killed: the next activation knows it replaces a server that died.
    let mut server =
        activate("the activated name server", &socket, "--seqpacket", &notes.path, &args, &dir.join("third"));
    assert!(list_names(&socket).status.success(), "{}", server.log());
    notes.next("READY=1 before the kill");
    server.kill9();
    let mut server =
        activate("the activated name server", &socket, "--seqpacket", &notes.path, &args, &dir.join("fourth"));
    let out = list_names(&socket);
    assert!(out.status.success(), "after kill -9: {}\n{}", String::from_utf8_lossy(&out.stderr), server.log());
    notes.next("READY=1 after the kill");
    assert!(server.log().contains("replaces one that died"), "{}", server.log());
    assert!(server.terminate().success(), "{}", server.log());
}

#[test]
fn a_passed_socket_of_the_wrong_kind_or_path_is_refused() {
    assert_activation_tool();
    let dir = TempDir::new("svc-wrong");
    let socket = dir.join("name-server.sock");
    let notes = Notifications::new(&dir);
    let elsewhere = dir.join("elsewhere.sock");
    let cases: [(&str, &Path, &str); 2] = [
        // A stream socket (systemd's ListenStream=): it cannot carry the handshake.
        ("", &socket, "not a SOCK_SEQPACKET"),
        // The unit and the server disagree on the path.
        ("--seqpacket", &elsewhere, "not to the path asked for"),
    ];
    for (i, (kind, listen, expected)) in cases.into_iter().enumerate() {
        let args = [OsStr::new("name-server"), OsStr::new("--socket"), socket.as_os_str()];
        let mut server =
            activate("a misconfigured activation", listen, kind, &notes.path, &args, &dir.join(format!("log{i}")));
        // Connect to start it (the connect itself may succeed or be refused).
        let _ = std::os::unix::net::UnixStream::connect(listen);
        let _ = list_names(listen);
        let st = server.wait();
        assert!(!st.success(), "case {i}: the server served a wrong socket");
        assert!(server.log().contains(expected), "case {i}: {}", server.log());
        assert!(notes.none_waiting(), "case {i}: a refused server said it was ready");
        let _ = std::fs::remove_file(listen);
    }
}

#[test]
fn the_clock_server_starts_on_its_control_socket_and_is_ready_once_registered() {
    assert_activation_tool();
    let dir = TempDir::new("svc-clock");
    let ns_socket = dir.join("name-server.sock");
    let control = dir.join("clock-control.sock");
    let notes = Notifications::new(&dir);
    let name = ictus_testkit::unique("clock");
    // The name server activated on its socket, the clock server on its control socket:
    // the clock server's registration is the connect that starts the name server.
    let ns_args = [OsStr::new("name-server"), OsStr::new("--socket"), ns_socket.as_os_str()];
    let mut ns = activate("the name server", &ns_socket, "--seqpacket", &notes.path, &ns_args, &dir.join("ns.log"));
    let clock_args = [
        OsStr::new("clock-server"),
        OsStr::new("--name-server"),
        ns_socket.as_os_str(),
        OsStr::new("--control-socket"),
        control.as_os_str(),
        OsStr::new("--name"),
        OsStr::new(&name),
    ];
    let mut clock =
        activate("the clock server", &control, "--seqpacket", &notes.path, &clock_args, &dir.join("clock.log"));
    let out = Command::new(ictus())
        .args(["clock", "--control-socket"])
        .arg(&control)
        .arg("stats")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}\n{}", String::from_utf8_lossy(&out.stderr), clock.log(), ns.log());
    // Two READY=1, the name server's and the clock server's, in either order.
    let ready: Vec<String> = (0..2).map(|_| notes.next("READY=1 of both")).collect();
    let pids = [ns.pid(), clock.pid()];
    for pid in pids {
        let from_pid =
            |r: &String| r.lines().any(|l| l == "READY=1") && r.lines().any(|l| l == format!("MAINPID={pid}"));
        assert!(ready.iter().any(from_pid), "no READY=1 from {pid}: {ready:?}");
    }
    // Ready means registered: the name is there.
    let listed = list_names(&ns_socket);
    assert!(String::from_utf8_lossy(&listed.stdout).lines().any(|l| l == name), "{listed:?}");
    assert!(clock.terminate().success(), "{}", clock.log());
    assert!(ns.terminate().success(), "{}", ns.log());
    assert!(control.exists() && ns_socket.exists(), "the sockets are the service manager's");
}

#[test]
fn the_midi_server_says_ready_once_registered() {
    let dir = TempDir::new("svc-midi");
    let ns_socket = dir.join("name-server.sock");
    let notes = Notifications::new(&dir);
    let mut ns = Proc::spawn_logged(
        "the name server",
        Command::new(ictus()).args([OsStr::new("name-server"), OsStr::new("--socket"), ns_socket.as_os_str()]),
        &dir.join("ns.log"),
    );
    wait_until("the name server's socket", || ns_socket.exists());
    let name = ictus_testkit::unique("midi");
    let cable = format!("cable:{}", ictus_testkit::unique("svc"));
    let mut midi = Proc::spawn_logged(
        "the MIDI server",
        Command::new(ictus())
            .args(["midi-server", "--timesharing", "--device", &cable, "--name", &name, "--name-server"])
            .arg(&ns_socket)
            .env("NOTIFY_SOCKET", &notes.path),
        &dir.join("midi.log"),
    );
    let ready = notes.next("the MIDI server's READY=1");
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(ready.contains(&format!("MAINPID={}", midi.pid())), "{ready:?}");
    let listed = list_names(&ns_socket);
    assert!(String::from_utf8_lossy(&listed.stdout).lines().any(|l| l == name), "{listed:?}\n{}", midi.log());
    assert!(midi.terminate().success(), "{}", midi.log());
    assert!(notes.next("STOPPING=1").contains("STOPPING=1"));
    assert!(ns.terminate().success(), "{}", ns.log());
}

/// The fenced `lang` block that follows the heading `heading` in the README.
fn readme_block(heading: &str, lang: &str) -> String {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README.md");
    let at = text.find(heading).unwrap_or_else(|| panic!("the README has no {heading:?}"));
    let fence = format!("```{lang}\n");
    let start = text[at..].find(&fence).expect("a fenced block") + at + fence.len();
    let len = text[start..].find("```\n").expect("the block's end");
    text[start..start + len].to_owned()
}

#[test]
fn the_readme_services_example_runs() {
    assert_activation_tool();
    let script = readme_block("## As system services", "sh");
    let bin_dir = ictus().parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let dir = TempDir::new("svc-readme");
    let logs = TempDir::new("svc-readme-log");
    let mut bash = Command::new("bash");
    bash.args(["-euo", "pipefail", "-c", &script]).env("PATH", path).env("TMPDIR", dir.path());
    let mut p = Proc::spawn_logged("the README's services example", &mut bash, &logs.join("log"));
    p.wait_success();
    assert!(p.log().contains("serving on"), "the name server did not start: {}", p.log());
    assert!(p.log().contains("stopped; left"), "the name server did not stop cleanly: {}", p.log());
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "the example left files behind");
}

#[test]
fn the_units_install_and_verify() {
    let dir = TempDir::new("svc-units");
    let analyze = Command::new("systemd-analyze").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(analyze, "systemd-analyze is missing: install Debian's systemd package (scripts/setup.sh does)");
    for scope in ["user", "system"] {
        let prefix = dir.join(scope);
        let units = dir.join(format!("{scope}-units"));
        let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/install-services.sh"))
            .arg(format!("--{scope}"))
            .arg(&prefix)
            .env("ICTUS_BIN", ictus())
            .env("ICTUS_UNIT_DIR", &units)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{scope}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(prefix.join("bin/ictus").exists());
        let mut files: Vec<PathBuf> = std::fs::read_dir(&units).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(
            names,
            [
                "ictus-clock-server.service",
                "ictus-clock-server.socket",
                "ictus-midi-server.service",
                "ictus-name-server.service",
                "ictus-name-server.socket"
            ],
            "{scope}"
        );
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            assert!(!text.contains('@'), "{}: a placeholder left", f.display());
            // Every server a unit names has its man page, for Documentation=.
            for page in text.lines().filter_map(|l| l.strip_prefix("Documentation=man:")) {
                let page = page.trim_end_matches("(1)");
                assert!(prefix.join(format!("share/man/man1/{page}.1")).exists(), "{}: no {page}.1", f.display());
            }
        }
        // systemd-analyze verify loads the units as systemd would (syntax, known
        // settings, the executables, dependencies among them) without a running
        // systemd. The user manager needs a runtime directory; the system one does not.
        let runtime = TempDir::new("svc-runtime");
        let mut verify = Command::new("systemd-analyze");
        verify.arg("verify").arg("--man=no");
        if scope == "user" {
            verify.arg("--user").env("XDG_RUNTIME_DIR", runtime.path());
        }
        let out = verify.args(&files).stdin(Stdio::null()).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && said.trim().is_empty(), "{scope}: systemd-analyze verify: {said}");
    }
}
