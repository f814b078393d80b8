//! The unprivileged path of `ictus_rt::thread`: a re-executed copy of this test drops
//! to uid/gid 65534 with `RLIMIT_RTPRIO` (and `RLIMIT_MEMLOCK`) lowered, asks for
//! real-time scheduling and memory locking, and reports what it got. The thread must
//! run anyway, keep `SCHED_OTHER`, learn why, and warn once per kind.
//!
//! Own `main` (harness = false): the child must be a fresh single-threaded process
//! whose privileges it can drop for good.
#![allow(unsafe_code)]

use std::process::Command;
use std::time::Duration;

use ictus_rt::thread::{configure_current_thread, current_policy, rt_privileges, Policy, RefusalKind, ThreadRequest};

const NOBODY: u32 = 65534;
/// The child's status when it cannot raise `RLIMIT_RTPRIO` (no `CAP_SYS_RESOURCE`).
const CANNOT_RAISE: i32 = 5;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // libtest-style filters/flags from `cargo test` are ignored.
    if args.iter().any(|a| a == "--child-mlock") {
        std::process::exit(child_mlock());
    }
    if let Some(pos) = args.iter().position(|a| a == "--child") {
        let rtprio: u64 = args.get(pos + 1).and_then(|a| a.parse().ok()).expect("--child RTPRIO");
        std::process::exit(child(rtprio));
    }
    if args.iter().any(|a| a == "--list") {
        println!("unprivileged_fifo_is_refused: test");
        println!("unprivileged_fifo_is_capped_at_rlimit_rtprio: test");
        println!("root_locks_memory: test");
        return;
    }
    if !rustix::process::geteuid().is_root() {
        println!("not root: cannot drop to uid {NOBODY}; the in-crate tests cover this user's path");
        return;
    }
    unprivileged_fifo_is_refused();
    unprivileged_fifo_is_capped_at_rlimit_rtprio();
    root_locks_memory();
    println!("thread_privileges: 3 passed");
}

/// Runs this binary as `--child RTPRIO`, with a watchdog; returns (status, stdout, stderr).
fn run_child(rtprio: u64) -> (i32, String, String) {
    run_child_with(&["--child", &rtprio.to_string()])
}

fn run_child_with(args: &[&str]) -> (i32, String, String) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn child");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("child hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The policy the child printed before asking: `SCHED_OTHER nice N`.
fn before(out: &str) -> &str {
    let b = out.lines().find_map(|l| l.strip_prefix("before: ")).expect("the child's starting policy");
    assert!(b.starts_with("SCHED_OTHER nice "), "{out}");
    b
}

fn unprivileged_fifo_is_refused() {
    let (code, out, err) = run_child(0);
    assert_eq!(code, 0, "child failed:\n{out}\n{err}");
    assert!(out.contains(&format!("fifo: {}", before(&out))), "{out}");
    assert!(out.contains("fifo refusal: SCHED_FIFO 80 not granted (EPERM"), "{out}");
    assert!(out.contains("RLIMIT_RTPRIO is 0"), "{out}");
    assert!(out.contains("deadline refusal: SCHED_DEADLINE") && out.contains("needs CAP_SYS_NICE"), "{out}");
    assert!(out.contains("mlock refusal:") && out.contains("RLIMIT_MEMLOCK"), "{out}");
    // Asked twice; warned once.
    assert_eq!(err.matches("SCHED_FIFO 80 not granted").count(), 1, "{err}");
    assert_eq!(err.matches("ictus: warning").count(), 3, "one per kind (fifo, deadline, mlock):\n{err}");
    println!("test unprivileged_fifo_is_refused ... ok");
}

fn unprivileged_fifo_is_capped_at_rlimit_rtprio() {
    let (code, out, err) = run_child(10);
    if code == CANNOT_RAISE {
        println!("test unprivileged_fifo_is_capped_at_rlimit_rtprio ... skipped: {}", err.trim());
        return;
    }
    assert_eq!(code, 0, "child failed:\n{out}\n{err}");
    if rt_privileges() {
        // An unprivileged user may use SCHED_FIFO up to RLIMIT_RTPRIO.
        assert!(out.contains("fifo: SCHED_FIFO 10"), "{out}");
        assert!(out.contains("RLIMIT_RTPRIO is 10; capped at SCHED_FIFO 10"), "{out}");
    } else {
        assert!(out.contains(&format!("fifo: {}", before(&out))), "{out}");
    }
    println!("test unprivileged_fifo_is_capped_at_rlimit_rtprio ... ok");
}

/// As root (CAP_IPC_LOCK), `mlockall` is granted: the process's locked memory grows,
/// and it can still allocate (MCL_FUTURE locks the new pages too).
fn root_locks_memory() {
    let (code, out, err) = run_child_with(&["--child-mlock"]);
    assert_eq!(code, 0, "child failed:\n{out}\n{err}");
    if out.contains("memory_locked: false") {
        // Root without CAP_IPC_LOCK (some containers): refused, and said why.
        assert!(err.contains("RLIMIT_MEMLOCK"), "{err}");
        println!("test root_locks_memory ... skipped: no CAP_IPC_LOCK here");
        return;
    }
    assert!(out.contains("memory_locked: true"), "{out}");
    let locked_kib: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmLck line");
    assert!(locked_kib >= 16 * 1024, "the 16 MiB allocated after locking is locked too: {locked_kib} kB");
    assert!(!err.contains("ictus: warning"), "{err}");
    println!("test root_locks_memory ... ok");
}

fn child_mlock() -> i32 {
    let g = configure_current_thread(&ThreadRequest { lock_memory: true, ..ThreadRequest::default() });
    println!("memory_locked: {}", g.memory_locked);
    let v: Vec<u8> = vec![1; 16 << 20];
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for line in status.lines().filter(|l| l.starts_with("VmLck:")) {
        println!("{line}");
    }
    println!("allocated {}", v.len());
    0
}

/// The child: drop privileges, ask, print what was granted. Exit status 0 unless the
/// dropping itself failed (the assertions are the parent's).
fn child(rtprio: u64) -> i32 {
    use rustix::process::{setrlimit, Resource, Rlimit};
    let lim = |v: u64| Rlimit { current: Some(v), maximum: Some(v) };
    if setrlimit(Resource::Rtprio, lim(rtprio)).is_err() {
        // Raising a hard limit needs CAP_SYS_RESOURCE, which a container may lack.
        eprintln!("cannot set RLIMIT_RTPRIO to {rtprio}");
        return if rtprio > 0 { CANNOT_RAISE } else { 3 };
    }
    if setrlimit(Resource::Memlock, lim(64 * 1024)).is_err() {
        eprintln!("cannot set RLIMIT_MEMLOCK");
        return 3;
    }
    // SAFETY: setgroups/setresgid/setresuid take values (and a null list of length 0);
    // this process is single-threaded here, and glibc applies them to every thread.
    let dropped = unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setresgid(NOBODY, NOBODY, NOBODY) == 0
            && libc::setresuid(NOBODY, NOBODY, NOBODY) == 0
    };
    if !dropped || rustix::process::geteuid().as_raw() != NOBODY {
        eprintln!("could not drop privileges: {}", std::io::Error::last_os_error());
        return 4;
    }
    // What the thread had before it asked: the parent checks a refusal left it so
    // (timesharing, at whatever nice the suite runs under).
    println!("before: {}", current_policy());
    let fifo = ThreadRequest { policy: Some(Policy::Fifo { priority: 80 }), ..ThreadRequest::default() };
    let g = configure_current_thread(&fifo);
    println!("fifo: {}", g.describe());
    if let Some(r) = g.refusal(RefusalKind::FixedPriority) {
        println!("fifo refusal: {r}");
    }
    // A second time: refused again, but not warned again.
    let again = configure_current_thread(&fifo);
    assert_eq!(again.policy, g.policy);
    if rtprio > 0 {
        return 0;
    }
    let g = configure_current_thread(&ThreadRequest {
        policy: Some(Policy::Deadline {
            runtime: Duration::from_millis(1),
            deadline: Duration::from_millis(10),
            period: Duration::from_millis(10),
        }),
        lock_memory: true,
        ..ThreadRequest::default()
    });
    println!("deadline: {}", g.describe());
    if let Some(r) = g.refusal(RefusalKind::Deadline) {
        println!("deadline refusal: {r}");
    }
    if let Some(r) = g.refusal(RefusalKind::MemoryLock) {
        println!("mlock refusal: {r}");
    }
    // The thread runs on with what it has.
    let v: Vec<u8> = vec![1; 1 << 20];
    println!("still running: {} {}", v.len(), current_policy());
    0
}
