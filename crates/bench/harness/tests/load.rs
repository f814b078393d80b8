//! Load processes start, run, stop, and leave nothing behind: no process and no file,
//! whether they are dropped, run to their end, or their parent is killed with
//! `kill -9`.
//!
//! Own `main` (harness = false): the loads re-execute this binary
//! (`__bench-child load …`), and the crash test re-executes it as an intermediate parent.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ictus_bench::load::{spawn_with, LoadConfig, LoadKind};

const WATCHDOG: Duration = Duration::from_secs(60);

fn main() {
    ictus_bench::maybe_run_child(&[]);
    let args: Vec<String> = std::env::args().collect();
    if let Some(pos) = args.iter().position(|a| a == "--intermediate") {
        intermediate(Path::new(&args[pos + 1]));
        return;
    }
    if args.iter().any(|a| a == "--list") {
        for t in
            ["each_load_starts_runs_and_stops_cleanly", "a_load_runs_to_its_end", "a_load_dies_with_its_killed_parent"]
        {
            println!("{t}: test");
        }
        return;
    }
    let dir = scratch_dir("main");
    each_load_starts_runs_and_stops_cleanly(&dir);
    a_load_runs_to_its_end();
    a_load_dies_with_its_killed_parent(&dir);
    std::fs::remove_dir(&dir).expect("scratch dir empty and removable");
    println!("load: 3 passed");
}

fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ictus-load-it-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WATCHDOG, "watchdog: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// user + system CPU ticks of a process, from `/proc/<pid>/stat`.
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0 };
    let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return 0 };
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 (utime) and 15 (stime); `after` starts at field 3.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// Whether a process is gone (or a zombie nobody has reaped yet: it runs no more).
fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rfind(')').is_some_and(|i| stat[i + 1..].trim_start().starts_with('Z')),
    }
}

/// Whether the process holds an open file in `dir` (an unnamed one reads as
/// `DIR/#INODE (deleted)` or `DIR/NAME (deleted)`).
fn holds_file_in(pid: u32, dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    entries.flatten().any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(dir)))
}

fn each_load_starts_runs_and_stops_cleanly(dir: &Path) {
    for kind in LoadKind::ALL {
        let cfg = LoadConfig { threads: Some(2), dir: Some(dir.to_path_buf()) };
        let mut load = spawn_with(kind, Duration::from_secs(600), &cfg).expect("spawn load");
        let pid = load.pid();
        assert!(load.is_running());
        wait_for("the load uses CPU", || cpu_ticks(pid) > 0);
        if kind == LoadKind::Disk {
            wait_for("the disk load has its file open", || holds_file_in(pid, dir));
            assert_eq!(std::fs::read_dir(dir).expect("readdir").count(), 0, "the file has no name");
        }
        drop(load);
        assert!(is_gone(pid), "{kind} load still running after drop");
        assert_eq!(std::fs::read_dir(dir).expect("readdir").count(), 0, "{kind} left files");
    }
    println!("test each_load_starts_runs_and_stops_cleanly ... ok");
}

fn a_load_runs_to_its_end() {
    let load = spawn_with(LoadKind::Cpu, Duration::from_millis(300), &LoadConfig::default()).expect("spawn");
    let pid = load.pid();
    let summary = load.finish().expect("summary");
    assert_eq!(summary.kind, LoadKind::Cpu);
    assert!(summary.work > 0, "{summary}");
    assert!(is_gone(pid));
    println!("test a_load_runs_to_its_end ... ok");
}

/// Run as `--intermediate DIR`: start a disk load, say its pid, and wait to be killed.
fn intermediate(dir: &Path) {
    let cfg = LoadConfig { threads: Some(1), dir: Some(dir.to_path_buf()) };
    let load = spawn_with(LoadKind::Disk, Duration::from_secs(600), &cfg).expect("spawn load");
    println!("pid {}", load.pid());
    std::thread::sleep(WATCHDOG * 2);
    drop(load);
}

fn a_load_dies_with_its_killed_parent(dir: &Path) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut parent =
        Command::new(exe).arg("--intermediate").arg(dir).stdout(Stdio::piped()).spawn().expect("spawn intermediate");
    let mut line = String::new();
    BufReader::new(parent.stdout.take().expect("stdout")).read_line(&mut line).expect("pid line");
    let pid: u32 = line.trim().strip_prefix("pid ").and_then(|p| p.parse().ok()).expect("pid");
    wait_for("the orphan-to-be has its file open", || holds_file_in(pid, dir));
    parent.kill().expect("kill -9 the parent");
    parent.wait().expect("reap the parent");
    wait_for("the load dies with its parent (PR_SET_PDEATHSIG)", || is_gone(pid));
    assert_eq!(std::fs::read_dir(dir).expect("readdir").count(), 0, "files left after kill -9");
    println!("test a_load_dies_with_its_killed_parent ... ok");
}
