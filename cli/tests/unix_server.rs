//! `ictus unix-server` as a process among processes: registered with a name server
//! (another process), two programs run through it at once, its counts read, its
//! policy changed — the next program gets the new one, the running ones keep theirs —
//! a change refused to another user by the uid the kernel stamped, and no stale
//! registration after `kill -9`.
//!
//! No test asserts a duration; waits are bounded by a watchdog only.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use ictus_ipc::Space;
use ictus_testkit::{wait_until, Proc, TempDir};

fn ictus() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ictus"))
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap()
}

fn names(ns: &Path) -> Vec<String> {
    let out = run(ictus().arg("names").arg("--socket").arg(ns));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

/// The read-only lookups the library made natively, on the line of `ictus unix stats`
/// that starts with `prefix`.
fn native(stats: &str, prefix: &str) -> u64 {
    let line = stats.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix:?} in {stats}"));
    let (before, _) = line
        .rsplit_once(" read-only lookups by the library")
        .unwrap_or_else(|| panic!("no native lookups on {line:?}"));
    before.rsplit(' ').next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no count on {line:?}"))
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| format!("<{}: {e}>", p.display()))
}

/// `ictus unix run --server` of a shell command, in `dir`, as a child.
fn program(dir: &Path, sock: &Path, script: &str) -> Proc {
    Proc::spawn(
        "ictus unix run --server",
        ictus()
            .args(["-q", "unix", "run", "--server", "--socket"])
            .arg(sock)
            .args(["--", "sh", "-c", script])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

#[test]
fn unix_server_registers_serves_changes_its_policy_and_leaves_no_name_after_kill_9() {
    let dir = TempDir::new("unix-server");
    let d = dir.path();
    let (ns_sock, run_sock) = (dir.join("ns.sock"), dir.join("run.sock"));
    std::fs::write(dir.join("secret1"), "one\n").unwrap();
    std::fs::write(dir.join("secret2"), "two\n").unwrap();
    let policy1 = dir.join("policy1");
    std::fs::write(&policy1, format!("hide {}\n", dir.join("secret1").display())).unwrap();
    let policy2 = dir.join("policy2");
    std::fs::write(&policy2, format!("hide {}\n", dir.join("secret2").display())).unwrap();

    let mut ns = Proc::spawn(
        "ictus name-server",
        ictus().arg("name-server").arg("--socket").arg(&ns_sock).stdout(Stdio::null()).stderr(Stdio::null()),
    );
    wait_until("the name server to answer", || {
        run(ictus().arg("names").arg("--socket").arg(&ns_sock)).status.success()
    });
    let start_server = || {
        Proc::spawn(
            "ictus unix-server",
            ictus()
                .arg("unix-server")
                .arg("--policy")
                .arg(&policy1)
                .arg("--socket")
                .arg(&run_sock)
                .arg("--name-server")
                .arg(&ns_sock)
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
    };
    let mut server = start_server();
    wait_until("the Unix server to be registered", || names(&ns_sock).iter().any(|n| n == "unix"));
    let ask = |args: &[&str]| run(ictus().args(["unix"]).args(args).arg("--name-server").arg(&ns_sock));

    // Two programs at once under policy 1 (secret1 hidden); each waits for `go`
    // before looking again.
    let wait_go = "while [ ! -e go ]; do sleep 0.05; done";
    let mut a = program(
        d,
        &run_sock,
        &format!("cat secret1 > a1 2>&1; cat secret2 > a2 2>&1; touch a-ready; {wait_go}; cat secret1 > a3 2>&1; cat secret2 > a4 2>&1"),
    );
    let mut b =
        program(d, &run_sock, &format!("cat secret2 > b1 2>&1; touch b-ready; {wait_go}; cat secret1 > b2 2>&1; true"));
    wait_until("both programs to start", || dir.join("a-ready").exists() && dir.join("b-ready").exists());
    assert!(read(&dir.join("a1")).contains("No such file"), "{}", read(&dir.join("a1")));
    assert_eq!(read(&dir.join("a2")), "two\n");
    assert_eq!(read(&dir.join("b1")), "two\n");

    let stats = ask(&["stats"]);
    assert!(stats.status.success(), "{}", text(&stats));
    let s = String::from_utf8_lossy(&stats.stdout).into_owned();
    assert!(s.contains("programs running 2, started 2"), "{s}");
    assert!(s.contains("policy 1"), "{s}");
    assert_eq!(s.lines().filter(|l| l.starts_with("program ")).count(), 2, "{s}");
    let served = |s: &str, prefix: &str| -> u64 {
        let line = s.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix:?} in {s}"));
        line.split("served ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()).unwrap()
    };
    assert!(served(&s, "total") > 0, "{s}");
    assert!(served(&s, "program 1") > 0 && served(&s, "program 2") > 0, "{s}");
    // Policy 1 hides something: the libraries look nothing up natively.
    assert_eq!((native(&s, "program 1"), native(&s, "program 2"), native(&s, "total")), (0, 0, 0), "{s}");

    // An invalid policy: refused with its line, nothing changed.
    let bad = dir.join("bad");
    std::fs::write(&bad, "network off\nfrobnicate /x\n").unwrap();
    let refused = ask(&["policy", "--set", bad.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(text(&refused).contains("policy line 2") && text(&refused).contains("unchanged"), "{}", text(&refused));

    // Another user cannot change it, even holding a right to the name server (handed
    // over as its bootstrap port): the server goes by the uid the kernel stamped.
    if rustix::process::geteuid().is_root() {
        use std::os::unix::process::CommandExt;
        let space = Space::new();
        let ns_client = ictus_name_server::Client::connect_socket(&space, &ns_sock).unwrap();
        // A policy file nobody can read (so the refusal is the server's, not the
        // file's).
        let open = TempDir::shared("unix-server-nobody");
        let theirs = open.join("policy");
        std::fs::File::create(&theirs).unwrap().write_all(b"# anything goes\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut cmd = ictus();
        cmd.args(["unix", "policy", "--set"]).arg(&theirs).current_dir("/").uid(65534).gid(65534);
        space.give_bootstrap(&mut cmd, ns_client.server_port()).unwrap();
        let out = run(&mut cmd);
        assert!(!out.status.success(), "nobody changed the policy: {}", text(&out));
        assert!(text(&out).contains("only the Unix server's own user and root"), "{}", text(&out));
        // Reading is for any holder of the port.
        let mut cmd = ictus();
        cmd.args(["unix", "policy"]).current_dir("/").uid(65534).gid(65534);
        space.give_bootstrap(&mut cmd, ns_client.server_port()).unwrap();
        let out = run(&mut cmd);
        assert!(out.status.success() && text(&out).contains("# policy 1"), "{}", text(&out));
    } else {
        eprintln!("not root: the test of another user's policy change is skipped");
    }

    // The server's own user may: policy 2 hides secret2 instead.
    let set = ask(&["policy", "--set", policy2.to_str().unwrap()]);
    assert!(set.status.success(), "{}", text(&set));
    assert!(text(&set).contains("policy 2 in force"), "{}", text(&set));
    let now = ask(&["policy"]);
    assert!(text(&now).contains("# policy 2") && text(&now).contains("secret2"), "{}", text(&now));

    // The next program gets policy 2.
    let mut c = program(d, &run_sock, "cat secret1 > c1 2>&1; cat secret2 > c2 2>&1; true");
    assert!(c.wait().success());
    assert_eq!(read(&dir.join("c1")), "one\n");
    assert!(read(&dir.join("c2")).contains("No such file"), "{}", read(&dir.join("c2")));

    // The running ones keep policy 1.
    std::fs::write(dir.join("go"), "").unwrap();
    assert!(a.wait().success());
    assert!(b.wait().success());
    assert!(read(&dir.join("a3")).contains("No such file"), "{}", read(&dir.join("a3")));
    assert_eq!(read(&dir.join("a4")), "two\n");
    assert!(read(&dir.join("b2")).contains("No such file"), "{}", read(&dir.join("b2")));

    let end = ask(&["stats"]);
    let e = String::from_utf8_lossy(&end.stdout).into_owned();
    assert!(e.contains("started 3") && e.contains("policy 2"), "{e}");
    assert!(served(&e, "total") > served(&s, "total"), "the total keeps the counts of ended programs: {s} / {e}");

    // Native lookups through the long-lived server: a program under a policy that
    // hides nothing (policy 3, the host's tree) makes its read-only lookups in its
    // library, counted per program and in the total; one under a policy that hides
    // something (policy 2) makes none. Both run at once, waiting for `go2`.
    let mut f = program(d, &run_sock, "cat secret2 > f1 2>&1; touch f-ready; while [ ! -e go2 ]; do sleep 0.05; done");
    wait_until("the program under policy 2 to start", || dir.join("f-ready").exists());
    let identity = dir.join("identity");
    std::fs::write(&identity, "# the host's tree: nothing hidden\n").unwrap();
    let set = ask(&["policy", "--set", identity.to_str().unwrap()]);
    assert!(set.status.success() && text(&set).contains("policy 3 in force"), "{}", text(&set));
    let mut g = program(d, &run_sock, "cat secret2 > g1 2>&1; touch g-ready; while [ ! -e go2 ]; do sleep 0.05; done");
    wait_until("the program under policy 3 to start", || dir.join("g-ready").exists());
    let running = ask(&["stats"]);
    let r = String::from_utf8_lossy(&running.stdout).into_owned();
    let line_of = |policy: &str| -> String {
        let lines: Vec<&str> = r.lines().filter(|l| l.starts_with("program ") && l.contains(policy)).collect();
        assert_eq!(lines.len(), 1, "one program with {policy:?}: {r}");
        lines[0].split(':').next().unwrap().to_owned()
    };
    let (under2, under3) = (line_of("policy 2)"), line_of("policy 3)"));
    assert_eq!(native(&r, &under2), 0, "{r}");
    assert!(served(&r, &under2) > 0, "{r}");
    let seen = native(&r, &under3);
    assert!(seen > 0, "{r}");
    assert!(native(&r, "total") > 0, "{r}");
    std::fs::write(dir.join("go2"), "").unwrap();
    assert!(f.wait().success());
    assert!(g.wait().success());
    assert!(read(&dir.join("f1")).contains("No such file"), "{}", read(&dir.join("f1")));
    assert_eq!(read(&dir.join("g1")), "two\n");
    let after = ask(&["stats"]);
    let a = String::from_utf8_lossy(&after.stdout).into_owned();
    assert!(native(&a, "total") >= seen, "the total keeps the native lookups of ended programs: {r} / {a}");

    // kill -9: the name server drops the registration with the dead port.
    server.kill9();
    wait_until("the dead server's name to go", || !names(&ns_sock).iter().any(|n| n == "unix"));
    let gone = ask(&["stats"]);
    assert!(!gone.status.success());
    assert!(text(&gone).contains("start `ictus unix-server` first"), "{}", text(&gone));
    // A new server takes over the run socket the killed one left.
    let mut again = start_server();
    wait_until("the new server to be registered", || names(&ns_sock).iter().any(|n| n == "unix"));
    let mut p = program(d, &run_sock, "cat secret2 > d1 2>&1");
    assert!(p.wait().success());
    assert_eq!(read(&dir.join("d1")), "two\n");
    assert!(again.terminate().success());
    assert!(!run_sock.exists(), "the run socket is removed at a clean stop");
    assert!(!names(&ns_sock).iter().any(|n| n == "unix"));
    assert!(ns.terminate().success());
}

#[test]
fn unix_server_without_a_name_server_says_so_and_leaves_nothing() {
    let dir = TempDir::new("unix-server");
    let out = run(ictus()
        .arg("unix-server")
        .arg("--name-server")
        .arg(dir.join("none.sock"))
        .arg("--socket")
        .arg(dir.join("run.sock")));
    assert!(!out.status.success());
    assert!(text(&out).contains("start `ictus name-server` first"), "{}", text(&out));
    assert!(!dir.join("run.sock").exists(), "no run socket left behind");
    let stats = run(ictus().args(["unix", "stats", "--name-server"]).arg(dir.join("none.sock")));
    assert!(!stats.status.success());
    assert!(text(&stats).contains("start `ictus name-server` first"), "{}", text(&stats));
}

/// `ictus unix run --server` decides nothing about what its program sees: the server
/// does. So it refuses a run socket served by another user (here `nobody`'s real
/// `ictus unix-server`, which would take root's program) with a clear error, before
/// sending anything, judged by the uid the kernel gives for the socket's server
/// (`SO_PEERCRED`).
#[test]
fn unix_run_refuses_a_server_of_another_user() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root to start a server as another user");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = TempDir::shared("unix-server-other");
    // Writable by anyone: had the program run under nobody's server, its file would be there.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let theirs = dir.join("nobody");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ns_sock, run_sock) = (theirs.join("ns.sock"), theirs.join("run.sock"));
    let as_nobody = |cmd: &mut Command| {
        cmd.current_dir("/").uid(65534).gid(65534).env_remove("XDG_RUNTIME_DIR");
    };
    let mut ns = {
        let mut cmd = ictus();
        cmd.arg("name-server").arg("--socket").arg(&ns_sock).stdout(Stdio::null()).stderr(Stdio::null());
        as_nobody(&mut cmd);
        Proc::spawn("ictus name-server as nobody", &mut cmd)
    };
    wait_until("nobody's name server to answer", || {
        let mut cmd = ictus();
        cmd.arg("names").arg("--socket").arg(&ns_sock);
        as_nobody(&mut cmd);
        run(&mut cmd).status.success()
    });
    let mut server = {
        let mut cmd = ictus();
        cmd.arg("unix-server")
            .arg("--socket")
            .arg(&run_sock)
            .arg("--name-server")
            .arg(&ns_sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        as_nobody(&mut cmd);
        Proc::spawn("ictus unix-server as nobody", &mut cmd)
    };
    wait_until("nobody's Unix server to be registered", || {
        let mut cmd = ictus();
        cmd.arg("names").arg("--socket").arg(&ns_sock);
        as_nobody(&mut cmd);
        String::from_utf8_lossy(&run(&mut cmd).stdout).lines().any(|n| n == "unix")
    });
    let out = dir.join("ran");
    let refused = run(ictus()
        .args(["-q", "unix", "run", "--server", "--socket"])
        .arg(&run_sock)
        .args(["--", "sh", "-c", &format!("echo ran > {}", out.display())])
        .current_dir(dir.path()));
    assert!(!refused.status.success(), "root's program ran under nobody's server: {}", text(&refused));
    assert!(text(&refused).contains("runs as uid 65534, not as this user"), "{}", text(&refused));
    assert!(!out.exists(), "the program ran");
    assert!(server.terminate().success());
    assert!(ns.terminate().success());
}
