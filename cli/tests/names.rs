//! `ictus name-server` and `ictus names` as processes: registrations that die with
//! their task, unregistering across tasks, signals, stale sockets, the bootstrap port.
//!
//! Child tasks are this test binary run again with `--exact child_role` and a role in
//! the environment. No test asserts a duration; waits are bounded by a watchdog only.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ictus_ipc::Space;
use ictus_name_server::{server, Client, ClientError};
use ictus_testkit::{expect_line, wait_until, Proc, Role, TempDir};

const ROLE: Role = Role { env: "ICTUS_NAMES_TEST_ROLE" };
const SOCKET_ENV: &str = "ICTUS_NAMES_TEST_SOCKET";
const NAME_ENV: &str = "ICTUS_NAMES_TEST_NAME";

fn ictus() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ictus"))
}

/// The name server's socket in a test's directory.
fn sock(dir: &TempDir) -> PathBuf {
    dir.join("ns.sock")
}

/// `ictus name-server --socket PATH`, its stderr in a log beside the socket.
fn spawn_server(path: &Path) -> Proc {
    ictus_testkit::spawn_ictus_name_server(Path::new(env!("CARGO_BIN_EXE_ictus")), path)
}

/// Start a server and wait until its socket answers.
fn start_server(path: &Path) -> Proc {
    ictus_testkit::ictus_name_server(Path::new(env!("CARGO_BIN_EXE_ictus")), path)
}

fn names_output(path: &Path, json: bool) -> Output {
    let mut cmd = ictus();
    cmd.arg("names").arg("--socket").arg(path);
    if json {
        cmd.arg("--json");
    }
    cmd.output().expect("run ictus names")
}

/// `ictus names --socket PATH`, which must succeed.
fn names(path: &Path) -> Vec<String> {
    let out = names_output(path, false);
    assert!(out.status.success(), "ictus names failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect()
}

/// Run this test binary as a child in `role`; its `ROLE: ` lines arrive on the channel.
fn spawn_role(
    role: &str,
    socket: &Path,
    name: &str,
    setup: impl FnOnce(&mut Command),
) -> (Proc, mpsc::Receiver<String>) {
    let mut cmd = ROLE.command("child_role", role);
    cmd.env(SOCKET_ENV, socket).env(NAME_ENV, name).stdout(Stdio::piped());
    setup(&mut cmd);
    let mut child = Proc::spawn(&format!("child role {role}"), &mut cmd);
    let rx = child.tagged_lines("ROLE: ");
    (child, rx)
}

/// The child side: does nothing unless run by `spawn_role`.
#[test]
fn child_role() {
    let Some(role) = ROLE.current() else {
        return;
    };
    let socket = PathBuf::from(std::env::var_os(SOCKET_ENV).unwrap());
    let name = std::env::var(NAME_ENV).unwrap();
    let space = Space::task();
    match role.as_str() {
        // Register a port of ours, say so, and wait to be killed.
        "register-and-wait" => {
            let ns = Client::connect_socket(&space, &socket).unwrap();
            let port = space.allocate_port().unwrap();
            ns.register(&name, port).unwrap();
            println!("ROLE: READY");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        // Try to unregister another task's name: refused; then with its right: done.
        "try-unregister" => {
            let ns = Client::connect_socket(&space, &socket).unwrap();
            let right = ns.lookup(&name).unwrap();
            match ns.unregister(&name) {
                Err(ClientError::NotOwner(_)) => println!("ROLE: NOT-OWNER"),
                other => println!("ROLE: unexpected {other:?}"),
            }
            match ns.unregister_with_right(&name, right) {
                Ok(()) => println!("ROLE: WITH-RIGHT-OK"),
                other => println!("ROLE: unexpected {other:?}"),
            }
        }
        // Find the name server through the inherited bootstrap port (there is no
        // socket at the default path), register, list, and exit.
        "bootstrap" => {
            let ns = Client::connect(&space).unwrap();
            let port = space.allocate_port().unwrap();
            ns.register(&name, port).unwrap();
            println!("ROLE: LIST {}", ns.list().unwrap().join(","));
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn names_lists_and_a_killed_registrant_vanishes() {
    let dir = TempDir::new("names");
    let path = sock(&dir);
    let mut server = start_server(&path);
    assert_eq!(names(&path), Vec::<String>::new());
    let out = names_output(&path, true);
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), "[]");

    // A name of ours, which must survive the other task's death.
    let space = Space::new();
    let ns = Client::connect_socket(&space, &path).unwrap();
    let mine = space.allocate_port().unwrap();
    ns.register("survivor \"quoted\"", mine).unwrap();

    let (mut child, rx) = spawn_role("register-and-wait", &path, "doomed", |_| {});
    expect_line(&rx, "READY");
    assert_eq!(names(&path), ["doomed", "survivor \"quoted\""]);
    let out = names_output(&path, true);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json, serde_json::json!(["doomed", "survivor \"quoted\""]));

    child.kill9();
    wait_until("the killed task's name to vanish", || names(&path) == ["survivor \"quoted\""]);
    assert!(matches!(ns.lookup("doomed"), Err(ClientError::NotFound(_))));

    server.sigterm();
    let st = server.wait();
    assert!(st.success(), "SIGTERM is a clean exit, not {st}; log:\n{}", server.log());
    assert!(!path.exists(), "the socket is removed on a clean exit");
    assert!(server.log().contains("stopped"), "log:\n{}", server.log());
    // Our client sees a dead server, not a hang.
    assert!(matches!(ns.list(), Err(ClientError::ServerDied)));
}

#[test]
fn only_the_registrant_or_the_right_holder_may_unregister() {
    let dir = TempDir::new("names");
    let path = sock(&dir);
    let mut server = start_server(&path);
    let space = Space::new();
    let ns = Client::connect_socket(&space, &path).unwrap();
    let port = space.allocate_port().unwrap();
    ns.register("parents", port).unwrap();

    let (mut child, rx) = spawn_role("try-unregister", &path, "parents", |_| {});
    expect_line(&rx, "NOT-OWNER");
    expect_line(&rx, "WITH-RIGHT-OK");
    assert!(child.wait().success());
    assert_eq!(names(&path), Vec::<String>::new());

    server.sigterm();
    assert!(server.wait().success());
}

#[test]
fn a_killed_server_leaves_a_path_the_next_one_reclaims() {
    let dir = TempDir::new("names");
    let path = sock(&dir);
    let mut first = start_server(&path);
    first.kill9();
    assert_eq!(first.try_wait().and_then(|s| s.signal()), Some(9));
    assert!(path.exists(), "kill -9 leaves the socket behind");
    let out = names_output(&path, false);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no name server is running"), "{err}");

    let mut second = start_server(&path);
    assert_eq!(names(&path), Vec::<String>::new());
    // A third on the same path refuses to start, and takes nothing from the second.
    let mut third = spawn_server(&path);
    let st = third.wait();
    assert!(!st.success());
    assert!(third.log().contains("already running"), "log:\n{}", third.log());
    assert_eq!(names(&path), Vec::<String>::new());

    second.sigterm();
    assert!(second.wait().success(), "log:\n{}", second.log());
    assert!(!path.exists());
}

#[test]
fn a_child_finds_the_name_server_through_its_bootstrap_port() {
    let dir = TempDir::new("names");
    let running = server::spawn(Space::new(), None).unwrap();
    let space = Space::new();
    let ns = Client::from_right(&space, space.insert_send_fd(running.service_fd().unwrap()).unwrap());
    // No server at the child's default socket path: only the bootstrap port leads to ours.
    let empty_runtime_dir = dir.path().join("runtime");
    std::fs::create_dir(&empty_runtime_dir).unwrap();
    let (mut child, rx) = spawn_role("bootstrap", &sock(&dir), "from-child", |cmd| {
        cmd.env("XDG_RUNTIME_DIR", &empty_runtime_dir);
        running.space().give_bootstrap(cmd, running.service_port()).unwrap();
    });
    expect_line(&rx, "LIST from-child");
    assert!(child.wait().success());
    // The child is gone, and its port with it.
    wait_until("the exited child's name to vanish", || ns.list().unwrap().is_empty());
    running.stop().unwrap();
}

#[test]
fn names_without_a_server_is_a_clear_error() {
    let dir = TempDir::new("names");
    let out = names_output(&sock(&dir), false);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no name server is running") && err.contains("ns.sock"), "{err}");
    // The default path under $XDG_RUNTIME_DIR, with no bootstrap port.
    let out =
        ictus().arg("names").env("XDG_RUNTIME_DIR", dir.path()).env_remove("ICTUS_BOOTSTRAP_FD").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no name server is running") && err.contains("ictus/name-server.sock"), "{err}");
}
