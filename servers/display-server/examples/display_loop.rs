//! One workload over one transport, N times, for profilers: a display server on a
//! private Xvfb (threads of this process) and one client.
//!
//! ```text
//! display_loop TRANSPORT N [muncher|frames|flushes]
//! ```
//!
//! `muncher`: xor a 256×256 window, then sync (002 Table 1's iteration); `frames`: a
//! 1920×1080 frame written into a lent buffer, presented now, synced with the screen
//! (000 §10); `flushes`: a 4×4 fill, then a flush, N times and one sync at the end
//! (the maze's pattern of 002 §4.2). Prints `START pid` before the loop and `END x us/iter` after it, with
//! 300 ms of quiet on each side, so that a profiler attached to the whole run sees the
//! loop apart from the set-up. `doc/display.md` says how it was profiled:
//! `perf trace -s`, and `perf stat -e task-clock,context-switches` of two runs of
//! different N, subtracted (the paper's way of taking start-up out).
//!
//! Environment: `SPIN_US` (both ends' spin budget, as `ictus bench display --spin-us`;
//! default 0); `REALTIME` (`0`: the server's threads stay timesharing; `all`: every
//! one asks for `SCHED_FIFO`; default: the presenter only, as in the experiment's
//! server). Run it under `taskset -c 0`
//! for the experiment's placement (client, server and Xvfb on one CPU).

use std::time::{Duration, Instant};

use ictus_display::{ConnectOptions, Display, Rect, Transport};
use ictus_display_server::xvfb::Xvfb;
use ictus_display_server::{Options, Screen};
use ictus_ipc::Space;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [t, n] => t.parse::<Transport>().ok().zip(n.parse::<usize>().ok()).map(|(t, n)| (t, n, "muncher")),
        [t, n, w] if ["muncher", "frames", "flushes"].contains(&w.as_str()) => {
            t.parse::<Transport>().ok().zip(n.parse::<usize>().ok()).map(|(t, n)| (t, n, w.as_str()))
        }
        _ => None,
    };
    let Some((t, n, workload)) = parsed else {
        eprintln!("usage: display_loop socket|port|shm N [muncher|frames|flushes]");
        std::process::exit(2);
    };
    let spin = Duration::from_micros(std::env::var("SPIN_US").ok().and_then(|v| v.parse().ok()).unwrap_or(0));
    let xvfb = Xvfb::start(1920, 1080).expect("Xvfb");
    let dir = std::env::temp_dir().join(format!("ictus-display-loop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("socket directory");
    let mut opts = Options::headless(0, 0, Some(dir.join("display.sock")));
    opts.screen = Screen::X { display: Some(xvfb.display().to_owned()), shm: true };
    opts.shm_wait.spin = spin;
    opts.realtime = std::env::var("REALTIME").map_or(true, |v| v != "0");
    opts.realtime_transports = std::env::var("REALTIME").is_ok_and(|v| v == "all");
    let server = ictus_display_server::spawn(&Space::new(), opts).expect("server");
    let space = Space::new();
    let name = space.insert_send_fd(server.service_fd().expect("right")).expect("insert");
    let mut o = ConnectOptions::new(t);
    o.wait.spin = spin;
    let mut d = Display::connect_to(&space, name, &o).expect("connect");
    let frames = workload == "frames";
    let (fw, fh) = if frames { (1920, 1080) } else { (256, 256) };
    let w = d.create_window(None, Rect::new(0, 0, fw, fh), 0).expect("window");
    d.sync_shown().expect("sync");
    eprintln!("START {}", std::process::id());
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    for i in 0..n {
        if frames {
            let mut f = d.frame(fw, fh).expect("frame");
            f.fill(i as u32 * 0x010101);
            f.present(w, 0, 0, 0, i as u32).expect("present");
            d.sync_shown().expect("sync");
        } else if workload == "flushes" {
            let at = (i % 64) as i16 * 4;
            d.fill_rect(w, Rect::new(at, at, 4, 4), i as u32 & 0xffffff).expect("draw");
            d.flush().expect("flush");
        } else {
            d.xor_rect(w, Rect::new(0, 0, 256, 256), (0x010203 * (i as u32 | 1)) & 0xffffff).expect("draw");
            d.sync().expect("sync");
        }
    }
    if workload == "flushes" {
        d.sync().expect("sync");
    }
    let el = t0.elapsed();
    eprintln!("END {:.1} us/iter", el.as_secs_f64() * 1e6 / n as f64);
    std::thread::sleep(Duration::from_millis(300));
    drop(d);
    server.stop();
    let _ = std::fs::remove_dir_all(dir);
}
