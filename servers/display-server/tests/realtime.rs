//! The server with its real-time threads on, where they once hung: the presenter at
//! `SCHED_FIFO` 62 and the transport threads at 60 all on one CPU with the X server and
//! the clients, under a load that keeps every CPU busy, while clients over every
//! transport create and destroy windows (round trips on both X connections from the
//! transport threads), xor and sync (present cycles on the transport threads) and
//! present frames (present cycles on the presenter) at once. When a thread that waits
//! for an X reply could spin on a lock or a reply that a lower-priority thread holds,
//! this hung for good: nothing below the spinning thread runs on that CPU.
//!
//! The same workload runs as root with every thread real-time, as root with the
//! presenter alone real-time (as `ictus display serve` runs it), and as `nobody`
//! (refused: timesharing, said once). The child runs under a watchdog of its own,
//! generous for a loaded machine (a hang is forever, a slow run is seconds).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ictus_display::{Rect, Transport};
use ictus_display_server::xvfb::Xvfb;
use ictus_display_server::{Options, Screen};
use ictus_testkit::{Proc, Role};

const CHILD: Role = Role { env: "ICTUS_DISPLAY_TEST_REALTIME" };

/// How long the child may take; it takes seconds unless it hangs.
const HANG: Duration = Duration::from_secs(240);

/// Rounds per client: each creates a window, xors and syncs, presents a frame, and
/// destroys the window.
const ROUNDS: u32 = 40;

/// Pin the calling thread (and what it starts afterwards) to `cpu`.
fn pin(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).expect("sched_setaffinity");
}

/// The child: everything on CPU 0, the server's threads real-time when allowed.
#[test]
fn child_realtime() {
    let Some(role) = CHILD.current() else { return };
    if role == "nobody" && rustix::process::geteuid().is_root() {
        // SAFETY: plain system calls at the start of a single-purpose child process;
        // glibc applies them to every thread.
        let ok = unsafe { libc::setresgid(65534, 65534, 65534) == 0 && libc::setresuid(65534, 65534, 65534) == 0 };
        assert!(ok, "dropping privileges");
    }
    // Before any thread or process is started: they inherit it (Xvfb included).
    pin(0);
    let xvfb = Xvfb::start(640, 480).unwrap_or_else(|e| panic!("{e}"));
    let server = Arc::new(server_with("realtime-load", |socket| {
        let mut opts = Options::headless(0, 0, Some(socket));
        opts.screen = Screen::X { display: Some(xvfb.display().to_owned()), shm: true };
        opts.realtime = true;
        // "presenter": as `ictus display serve` runs it (the transports timesharing,
        // below the presenter); otherwise every thread real-time.
        opts.realtime_transports = role != "presenter";
        opts
    }));
    let may = ictus_rt::thread::rt_privileges();
    for t in server.scheduling() {
        let asked = role != "presenter" || t.thread == "ictus-display-present";
        assert_eq!(t.asked.is_some(), asked, "{t:?}");
        assert_eq!(t.granted(), may || !asked, "{t:?}");
    }
    eprintln!("realtime granted: {may}");
    let clients: Vec<_> = Transport::ALL
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let server = server.clone();
            std::thread::spawn(move || {
                let mut d = connect(&server, t);
                let x0 = 200 * i as i16;
                for round in 0..ROUNDS {
                    let w = d.create_window(None, Rect::new(x0, 0, 160, 120), 0x102030).expect("window");
                    for k in 0..4u32 {
                        d.xor_rect(w, Rect::new(0, 0, 128, 96), 0x010203 * (round * 4 + k + 1)).expect("xor");
                        d.sync().expect("sync");
                    }
                    let mut f = d.frame(160, 120).expect("frame");
                    f.fill(0x00ab_cdef ^ round);
                    f.present(w, 0, 0, 0, round).expect("present");
                    d.sync_shown().expect("sync, shown");
                    d.destroy_window(w).expect("destroy");
                }
                d.sync().expect("sync");
            })
        })
        .collect();
    for c in clients {
        c.join().expect("a client");
    }
    // Every window went, in the X server too.
    wait_until("the windows destroyed", || server.windows().is_empty());
    println!("done");
}

/// Busy threads, one on each CPU, in the timesharing class, until dropped.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start() -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = (0..cpus)
            .map(|cpu| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    pin(cpu);
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                    }
                })
            })
            .collect();
        Load { stop, threads }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Run the child as `role` under the load, within [`HANG`]; returns its log.
fn run_loaded(role: &str) -> String {
    let dir = TempDir::new("display-realtime-log");
    let log = dir.join("stderr");
    let load = Load::start();
    let mut child = Proc::spawn_logged("a real-time server", &mut CHILD.command("child_realtime", role), &log);
    let deadline = Instant::now() + HANG;
    let st = loop {
        if let Some(st) = child.try_wait() {
            break st;
        }
        if Instant::now() > deadline {
            // Say where each thread of the child is before it goes.
            let mut where_ = String::new();
            if let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", child.pid())) {
                for t in tasks.flatten() {
                    let p = t.path();
                    let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
                    let wchan = std::fs::read_to_string(p.join("wchan")).unwrap_or_default();
                    let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
                    let state = stat.rsplit_once(") ").map_or("", |(_, r)| &r[..1]);
                    where_ += &format!("{} {state} {wchan}\n", comm.trim());
                }
            }
            child.kill9();
            drop(load);
            panic!("the server hung (watchdog {HANG:?}); its threads:\n{where_}its log:\n{}", child.log());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(load);
    assert!(st.success(), "the child failed: {st}; its log:\n{}", child.log());
    child.log()
}

#[test]
fn real_time_threads_on_one_busy_cpu_do_not_hang() {
    let log = run_loaded("root");
    if rustix::process::geteuid().is_root() {
        assert!(log.contains("realtime granted: true"), "{log}");
    }
}

#[test]
fn a_real_time_presenter_above_timesharing_transports_does_not_hang() {
    let log = run_loaded("presenter");
    if rustix::process::geteuid().is_root() {
        assert!(log.contains("realtime granted: true"), "{log}");
    }
}

#[test]
fn refused_real_time_threads_on_one_busy_cpu_still_work() {
    let log = run_loaded("nobody");
    if rustix::process::geteuid().is_root() {
        // As nobody without an RLIMIT_RTPRIO: refused, said once with its cost.
        assert!(log.contains("realtime granted: false"), "{log}");
        assert_eq!(log.matches(ictus_display_server::sched::COST).count(), 1, "{log}");
    }
}
