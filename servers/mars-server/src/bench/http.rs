//! HTTP downloads: throughput and the sender's CPU-seconds per GB of ours, nginx
//! (sendfile on) and a `splice` loop, with curl as the client of all three.
//!
//! **Cold and warm, all three on the same disk and cache state.** The headline is about
//! a stream server serving many clips mostly from disk: a library larger than memory,
//! each clip read from the disk when it is asked for. So before every cold download the
//! file's pages are dropped from the page cache (`posix_fadvise(POSIX_FADV_DONTNEED)`,
//! checked with `fincore`) — ours (a one-component volume file), nginx's and the splice
//! loop's file alike, all on the same file system. A warm round (the file read once
//! before) is the other end of the range. Ours serves downloads spliced from the page
//! cache (`IORING_OP_SPLICE` file → pipe → socket); its registered-buffer path
//! (`O_DIRECT`, zero-copy send), which paced streams use, is measured cold beside it.
//!
//! **CPU.** The client is curl, another process, so the sender's CPU is measured
//! alone: ours and the splice loop run in this process, which does nothing else during
//! their downloads, and are charged `getrusage(RUSAGE_SELF)`'s growth (every thread,
//! including io_uring's workers and threads that exited); nginx runs as one process
//! (`master_process off`), charged its `schedstat`.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use ictus_bench::report::{Better, Headline};
use ictus_bench::windows::Windowed;
use ictus_bench::BenchError;
use serde_json::json;

use super::rig::{self, check_stop, err, stopped, Priority, Rig};
use super::{med, Out};
use crate::{EngineConfig, StartOptions, Volume};

/// The classic splice loop, file → pipe → socket, for one connection; it runs in a
/// thread of this process and answers one request.
fn splice_server(listener: TcpListener, file: PathBuf, len: u64) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return };
        // Read the whole request head: closing with part of it unread would reset the
        // connection.
        let mut req = Vec::new();
        let mut b = [0u8; 4096];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 65536 {
            match s.read(&mut b) {
                Ok(0) | Err(_) => return,
                Ok(n) => req.extend_from_slice(&b[..n]),
            }
        }
        let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n");
        let Ok(f) = File::open(&file) else { return };
        let Ok((pr, pw)) = rustix::pipe::pipe() else { return };
        let _ = rustix::pipe::fcntl_setpipe_size(&pw, 1 << 20);
        let mut off = 0u64;
        while off < len {
            let want = (1usize << 20).min((len - off) as usize);
            let Ok(n) = rustix::pipe::splice(&f, Some(&mut off), &pw, None, want, rustix::pipe::SpliceFlags::MORE)
            else {
                return;
            };
            if n == 0 {
                return;
            }
            let mut left = n;
            while left > 0 {
                match rustix::pipe::splice(&pr, None, &s, None, left, rustix::pipe::SpliceFlags::MORE) {
                    Ok(0) | Err(_) => return,
                    Ok(m) => left -= m,
                }
            }
        }
    })
}

/// curl downloads `url` to nowhere: (bytes, seconds).
fn curl(url: &str) -> Result<(u64, f64), BenchError> {
    let out = rig::run_cmd(
        Command::new("curl")
            .args(["-s", "-S", "--max-time", "600", "-o", "/dev/null", "-w", "%{size_download} %{time_total}"])
            .arg(url),
    )?;
    let mut f = out.split_whitespace();
    let bytes = f.next().and_then(|b| b.parse().ok()).ok_or_else(|| err("curl", format!("output {out:?}")))?;
    let secs = f.next().and_then(|b| b.parse().ok()).ok_or_else(|| err("curl", format!("output {out:?}")))?;
    Ok((bytes, secs))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sender {
    Ours,
    OursThread,
    OursUring,
    OursDirect,
    Nginx,
    Splice,
}

impl Sender {
    fn name(self) -> &'static str {
        match self {
            Sender::Ours => "ictus mars",
            Sender::OursThread => "ictus mars download thread",
            Sender::OursUring => "ictus mars io_uring splice",
            Sender::OursDirect => "ictus mars O_DIRECT buffers",
            Sender::Nginx => "nginx sendfile",
            Sender::Splice => "splice loop",
        }
    }
}

/// One measured download: bytes/s, CPU-seconds per GB, and the round it was in.
type Run = (f64, f64, usize);

/// Where ours' CPU and wake-ups went in one download (the download thread's path):
/// CPU-seconds of the engine's threads and of the download threads, their wake-ups
/// (voluntary context switches), jobs handed to the thread and those handed over while
/// an earlier job of the connection was still out — per GB.
#[derive(Clone, Copy, Debug, Default)]
struct Split {
    engine_cpu: f64,
    thread_cpu: f64,
    engine_wakes: f64,
    thread_wakes: f64,
    jobs: f64,
    jobs_behind: f64,
}

/// The counters [`Split`] is taken from.
fn split_now(h: Option<&crate::EngineHandle>) -> [u64; 6] {
    let (ec, ew) = rig::threads_cpu_ns("ictus-mars");
    let (tc, tw) = rig::threads_cpu_ns("ictus-mars-dl");
    let s = h.and_then(|h| h.stats());
    let (jobs, behind) = s.map_or((0, 0), |s| (s.jobs, s.jobs_behind));
    [ec, tc, ew, tw, jobs, behind]
}

/// The HTTP comparison, on plain files in the rig's directory (no throttle).
pub fn http(rig: &mut Rig, quick: bool, out: &mut Out) -> Result<(), BenchError> {
    if !rig::have("curl", "--version") {
        out.notes.push("HTTP skipped: curl is not installed (scripts/setup.sh installs it)".into());
        return Ok(());
    }
    let len: u64 = if quick { 256 << 20 } else { 1 << 30 };
    // Each round downloads once per sender, one after another, so a round is a window in
    // which ours and each peer met the same disk and host (the VM's disk is served from
    // the host's cache or not, from one minute to the next: nginx's cold throughput
    // is bimodal here, 1.6-3.2 GB/s); the headlines take the median window by ratio.
    let rounds = if quick { 5 } else { 9 };
    let dir = rig.dir.join("http");
    std::fs::create_dir_all(&dir).map_err(|e| err("http dir", e))?;
    let clip = dir.join("clip.bin");
    rig::write_file(&clip, len, 23)?;
    let comp = dir.join("vol.img");
    {
        let mut v = Volume::create(std::slice::from_ref(&comp), 1 << 20, Some(len + (64 << 20)))
            .map_err(|e| err("volume", e))?;
        v.add_file("clip.bin", &clip, 4.0).map_err(|e| err("volume add", e))?;
    }
    let serve = |splice: bool, sendfile: bool, cold_direct: bool| {
        crate::start(&StartOptions {
            volume: vec![comp.clone()],
            listen: Some("127.0.0.1:0".into()),
            capability: Some(1e9),
            engine: EngineConfig {
                device_depth: 8,
                window: 8,
                buf_size: 1 << 20,
                buffers: 64,
                splice,
                sendfile,
                cold_direct,
                ..EngineConfig::default()
            },
            force_fallback: false,
        })
        .map_err(|e| err("starting ictus mars", e))
    };
    let server = serve(true, true, true)?;
    let direct_server = match serve(false, false, false) {
        Ok(s) => s,
        Err(e) => {
            server.stop();
            return Err(e);
        }
    };
    let uring_server = match serve(true, false, false) {
        Ok(s) => s,
        Err(e) => {
            server.stop();
            direct_server.stop();
            return Err(e);
        }
    };
    let thread_server = match serve(true, true, false) {
        Ok(s) => s,
        Err(e) => {
            server.stop();
            direct_server.stop();
            uring_server.stop();
            return Err(e);
        }
    };
    let ours_port = server.addr.map_or(0, |a| a.port());
    let direct_port = direct_server.addr.map_or(0, |a| a.port());
    let uring_port = uring_server.addr.map_or(0, |a| a.port());
    let thread_port = thread_server.addr.map_or(0, |a| a.port());
    let stats = server.handle.as_ref().and_then(|h| h.stats());
    if !stats.as_ref().is_some_and(|s| s.splice) {
        out.notes
            .push("HTTP: this kernel or storage gave no splice path: ours sent from the registered buffers".into());
    } else if !stats.as_ref().is_some_and(|s| s.sendfile) {
        out.notes.push("HTTP: the download thread did not start: ours spliced by io_uring".into());
    }
    let nginx = if rig::have("nginx", "-v") {
        let port = rig::free_port()?;
        Some((port, rig::start_nginx(rig, &dir, port, Priority::default())?))
    } else {
        out.notes.push("nginx is not installed (scripts/setup.sh installs nginx-light): its rows are missing".into());
        None
    };
    let senders =
        [Sender::Ours, Sender::OursThread, Sender::OursUring, Sender::OursDirect, Sender::Nginx, Sender::Splice];
    // (sender, warm) → runs
    let mut runs: Vec<((Sender, bool), Vec<Run>)> = Vec::new();
    let mut not_cold = 0;
    // (warm) → ours' splits
    let mut splits: Vec<(bool, Split)> = Vec::new();
    for round in 0..rounds {
        // Ours and nginx one right after the other, which of them first alternating
        // by round (the VM's disk changes speed from one download to the next: a pair
        // close in time meets the same disk); the other senders after them, rotating.
        let mut order =
            if round % 2 == 0 { vec![Sender::Ours, Sender::Nginx] } else { vec![Sender::Nginx, Sender::Ours] };
        let mut rest: Vec<Sender> = senders.iter().copied().filter(|s| !order.contains(s)).collect();
        let others = rest.len();
        rest.rotate_left(round % others);
        order.extend(rest);
        for warm in [false, true] {
            for &who in &order {
                if warm && matches!(who, Sender::OursDirect | Sender::OursThread) {
                    // O_DIRECT: no page cache to be warm in; the download thread warm is
                    // what ours does warm.
                    continue;
                }
                check_stop()?;
                let source: &Path =
                    if matches!(who, Sender::Ours | Sender::OursThread | Sender::OursUring | Sender::OursDirect) {
                        &comp
                    } else {
                        &clip
                    };
                rig::drop_cache(&comp);
                rig::drop_cache(&clip);
                if warm {
                    let _ = std::fs::read(source);
                } else if rig::cached_fraction(source).is_some_and(|f| f > 0.01) {
                    not_cold += 1;
                }
                let r = match who {
                    Sender::Ours | Sender::OursThread | Sender::OursUring | Sender::OursDirect => {
                        let port = match who {
                            Sender::Ours => ours_port,
                            Sender::OursThread => thread_port,
                            Sender::OursUring => uring_port,
                            _ => direct_port,
                        };
                        let h = if who == Sender::Ours { server.handle.as_ref() } else { None };
                        let s0 = split_now(h);
                        let c0 = rig::self_cpu_ns();
                        let r =
                            curl(&format!("http://127.0.0.1:{port}/clip.bin")).map(|d| (d, rig::self_cpu_ns() - c0));
                        if let (Some(_), Ok(((bytes, _), _))) = (h, &r) {
                            let s1 = split_now(h);
                            let d: Vec<f64> = (0..6).map(|i| s1[i].saturating_sub(s0[i]) as f64).collect();
                            let gb = *bytes as f64 / 1e9;
                            splits.push((
                                warm,
                                Split {
                                    engine_cpu: d[0] / 1e9 / gb,
                                    thread_cpu: d[1] / 1e9 / gb,
                                    engine_wakes: d[2] / gb,
                                    thread_wakes: d[3] / gb,
                                    jobs: d[4] / gb,
                                    jobs_behind: d[5] / gb,
                                },
                            ));
                        }
                        r
                    }
                    Sender::Nginx => {
                        let Some((port, pid)) = nginx else { continue };
                        let c0 = rig::schedstat_ns(pid);
                        curl(&format!("http://127.0.0.1:{port}/clip.bin")).map(|d| (d, rig::schedstat_ns(pid) - c0))
                    }
                    Sender::Splice => {
                        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| err("splice", e))?;
                        let port = l.local_addr().map_err(|e| err("splice", e))?.port();
                        let c0 = rig::self_cpu_ns();
                        let t = splice_server(l, clip.clone(), len);
                        let r = curl(&format!("http://127.0.0.1:{port}/clip.bin"));
                        let _ = t.join();
                        r.map(|d| (d, rig::self_cpu_ns() - c0))
                    }
                };
                let ((bytes, secs), cpu) = match r {
                    Ok(v) => v,
                    Err(e) if stopped() => return Err(e),
                    Err(e) => {
                        out.notes.push(format!("HTTP: a {} download failed: {e}", who.name()));
                        continue;
                    }
                };
                if bytes != len {
                    out.notes.push(format!("HTTP: {} sent {bytes} of {len} bytes in one run", who.name()));
                    continue;
                }
                let entry = match runs.iter().position(|(k, _)| *k == (who, warm)) {
                    Some(p) => &mut runs[p].1,
                    None => {
                        runs.push(((who, warm), Vec::new()));
                        &mut runs.last_mut().expect("just pushed").1
                    }
                };
                entry.push((bytes as f64 / secs, cpu as f64 / 1e9 / (bytes as f64 / 1e9), round));
            }
        }
    }
    let cold_downloads = server.handle.as_ref().and_then(|h| h.stats()).map_or(0, |s| s.cold_downloads);
    server.stop();
    direct_server.stop();
    uring_server.stop();
    thread_server.stop();
    let get = |who: Sender, warm: bool| -> &[Run] {
        runs.iter().find(|(k, _)| *k == (who, warm)).map_or(&[], |(_, r)| r.as_slice())
    };
    for warm in [false, true] {
        for who in senders {
            let r = get(who, warm);
            if r.is_empty() {
                continue;
            }
            let mbs: Vec<f64> = r.iter().map(|x| x.0).collect();
            let cpu: Vec<f64> = r.iter().map(|x| x.1).collect();
            if who == Sender::Ours {
                let sp: Vec<Split> = splits.iter().filter(|(w, _)| *w == warm).map(|(_, s)| *s).collect();
                let m = |f: fn(&Split) -> f64| med(&sp.iter().map(f).collect::<Vec<_>>());
                out.rows.push(json!({
                    "case": format!("HTTP {}: ictus mars, where it goes (per GB, medians)", if warm { "warm" } else { "cold" }),
                    "table": "http_split", "cache": if warm { "warm" } else { "cold" },
                    "engine_cpu_s_per_gb": m(|s| s.engine_cpu), "download_thread_cpu_s_per_gb": m(|s| s.thread_cpu),
                    "engine_wakes_per_gb": m(|s| s.engine_wakes), "download_thread_wakes_per_gb": m(|s| s.thread_wakes),
                    "jobs_per_gb": m(|s| s.jobs), "jobs_behind_per_gb": m(|s| s.jobs_behind), "runs": sp.len(),
                }));
            }
            out.rows.push(json!({
                "case": format!("HTTP {}: {}", if warm { "warm" } else { "cold" }, who.name()),
                "table": "http", "implementation": who.name(), "cache": if warm { "warm" } else { "cold" },
                "mb_s": med(&mbs) / 1e6, "min_mb_s": mbs.iter().copied().fold(f64::INFINITY, f64::min) / 1e6,
                "max_mb_s": mbs.iter().copied().fold(0.0, f64::max) / 1e6,
                "cpu_s_per_gb": med(&cpu), "min_cpu_s_per_gb": cpu.iter().copied().fold(f64::INFINITY, f64::min),
                "max_cpu_s_per_gb": cpu.iter().copied().fold(0.0, f64::max), "runs": r.len(),
            }));
        }
    }
    // Cold rounds as windows: ours beside the peer downloaded next to it in the same
    // round; the headline is the round whose ratio is the median (its own pair).
    let windows = |peer: Sender, i: usize| {
        let at =
            |who: Sender, r: usize| get(who, false).iter().find(|x| x.2 == r).map(|x| if i == 0 { x.0 } else { x.1 });
        Windowed::new((0..rounds).filter_map(|r| Some((at(Sender::Ours, r)?, at(peer, r)?))))
    };
    if let Some(w) = windows(Sender::Nginx, 0) {
        if let Some((ours, peer)) = w.median_window() {
            out.headline.push(
                Headline::new(
                    "mars_http_vs_nginx",
                    ours / 1e6,
                    peer / 1e6,
                    format!(
                        "nginx 1.22 sendfile on, cold page cache for both, same file system; the median of {} rounds by ratio (each round downloads once per sender, one after another)",
                        w.windows.len()
                    ),
                    "MB/s",
                    Better::Higher,
                )
                .with_target(1.0),
            );
            out.rows.extend(w.rows("HTTP cold, ictus mars vs nginx sendfile, bytes/s", "bytes/s"));
        }
    }
    if let Some(w) = windows(Sender::Splice, 1) {
        if let Some((ours, peer)) = w.median_window() {
            out.headline.push(
                Headline::new(
                    "mars_cpu_per_gb_vs_splice",
                    ours,
                    peer,
                    format!(
                        "a splice(2) loop file → pipe → socket, cold page cache for both; the median of {} rounds by ratio",
                        w.windows.len()
                    ),
                    "CPU s/GB",
                    Better::Lower,
                )
                .with_target(1.0),
            );
            out.rows.extend(w.rows("HTTP cold, ictus mars vs the splice loop, sender CPU s/GB", "CPU s/GB"));
        }
    }
    out.notes.push(format!(
        "HTTP: curl downloads {} MiB over loopback, one at a time, {rounds} rounds, in each ours and nginx one right after the other (which first alternating), then the others in a rotating order; cold = the file's pages dropped before each download (all read the VM's disk, same file system), warm = the file read once before; sender CPU = getrusage of this process for ours (io_uring's workers included) and the splice thread (curl is another process), schedstat of nginx's one process; ours: a download whose range is mostly out of the page cache (cachestat(2)) is read O_DIRECT into 1 MiB registered buffers, 8 in flight, queued by DRR and sent zero-copy, one mostly cached goes to the download thread; ours download thread (the same server with that choice off, every download through the page cache): splice(2) volume file → its own 1 MiB pipe → non-blocking socket on the download thread (epoll), each piece (up to 1 MiB, up to 4 per job: half the device queue of 8) when DRR dispatches it, a second job of the connection in flight behind the first (the thread starts it when the first ends whole); the engine, the download thread, nginx and the splice loop all timesharing (serve runs its engine at SCHED_FIFO 50: see doc/mars.md); ours io_uring splice: IORING_OP_SPLICE volume file → 1 MiB pipe → socket, linked chains, queued by DRR; ours O_DIRECT buffers: 1 MiB reads into registered buffers, 8 in flight, zero-copy send (which the kernel copies at delivery over loopback)",
        len >> 20
    ));
    let ours_runs = get(Sender::Ours, false).len() + get(Sender::Ours, true).len();
    out.notes.push(format!(
        "HTTP: ours sent {cold_downloads} of its {ours_runs} downloads from the registered buffers (cachestat found the range cold)"
    ));
    if not_cold > 0 {
        out.notes
            .push(format!("HTTP: {not_cold} cold download(s) started with more than 1 % of the file still cached"));
    }
    Ok(())
}
