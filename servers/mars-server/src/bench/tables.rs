//! 001 Tables 1–3 on the slow disks.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ictus_bench::report::{Better, Headline, PaperFigure};
use ictus_bench::{BenchError, LatencyRecorder};
use serde_json::json;

use super::account::{self, Sampler, Source, Window};
use super::client::{self, judge, Judged, Meter, Pull};
use super::rig::{self, check_stop, err, Priority, Readers, Rig, SlowDisks};
use super::{med, Out, CLIENT_FIFO, ENGINE_FIFO};
use crate::{EngineConfig, Running, StartOptions, Volume};

/// The volumes and the file system the tables use.
#[derive(Debug)]
pub struct Layout {
    /// One disk.
    pub single: Vec<PathBuf>,
    /// Striped over two disks.
    pub striped: Vec<PathBuf>,
    /// nginx's ext4 (on its own disk), holding `clip.bin`.
    pub www: PathBuf,
    /// nginx's disk.
    pub www_dev: String,
    /// The throttled device under `single`'s disk.
    pub single_lower: String,
    /// The throttled device under nginx's disk.
    pub www_lower: String,
    /// The clip's length.
    pub clip_len: u64,
    /// Bytes/s of each disk.
    pub rate: f64,
}

/// Builds the volumes: `clip.bin` on one disk (and `bg.bin`, which Table 2's downloads
/// read), `clip.bin` striped over two, and an ext4 file system with `clip.bin` for
/// nginx on the fourth.
pub fn layout(rig: &mut Rig, slow: &SlowDisks, clip_len: u64) -> Result<Layout, BenchError> {
    let d = &slow.disks;
    let clip = rig.dir.join("clip.bin");
    rig::write_file(&clip, clip_len, 19)?;
    let single = vec![PathBuf::from(&d[0])];
    let striped = vec![PathBuf::from(&d[1]), PathBuf::from(&d[2])];
    for comps in [&single, &striped] {
        let mut v = Volume::create(comps, 64 << 10, None).map_err(|e| err("volume", e))?;
        v.add_file("clip.bin", &clip, 4.0).map_err(|e| err("volume add", e))?;
        if comps == &single {
            v.add_file("bg.bin", &clip, 4.0).map_err(|e| err("volume add", e))?;
        }
    }
    let www = rig.dir.join("www");
    rig::mount_ext4(rig, &d[3], &www)?;
    std::fs::copy(&clip, www.join("clip.bin")).map_err(|e| err("copy to ext4", e))?;
    rig::run_cmd(&mut std::process::Command::new("sync"))?;
    let _ = std::fs::remove_file(&clip);
    Ok(Layout {
        single,
        striped,
        www,
        www_dev: d[3].clone(),
        single_lower: slow.lower[0].clone(),
        www_lower: slow.lower[3].clone(),
        clip_len,
        rate: slow.rate as f64,
    })
}

fn serve(volume: &[PathBuf], capability: f64, engine: EngineConfig) -> Result<Running, BenchError> {
    crate::start(&StartOptions {
        volume: volume.to_vec(),
        listen: Some("127.0.0.1:0".into()),
        capability: Some(capability),
        engine,
        force_fallback: false,
    })
    .map_err(|e| err("starting ictus mars", e))
}

fn port_of(s: &Running) -> u16 {
    s.addr.map_or(0, |a| a.port())
}

/// Plain read/send: pread 256 KiB at a time through the stripe map (page cache,
/// dropped first), send to a local sink. Bytes/s.
fn read_send(comps: &[PathBuf], name: &str, bytes: u64) -> Result<f64, BenchError> {
    let v = Volume::open(comps).map_err(|e| err("volume", e))?;
    let s = v.label.find(name).cloned().ok_or_else(|| err("volume", "no clip"))?;
    let files: Vec<File> = comps.iter().map(File::open).collect::<Result<_, _>>().map_err(|e| err("open", e))?;
    for c in comps {
        rig::drop_cache(c);
    }
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| err("sink", e))?;
    let addr = l.local_addr().map_err(|e| err("sink", e))?;
    let sink = std::thread::spawn(move || {
        let mut n = 0u64;
        if let Ok((mut c, _)) = l.accept() {
            let mut b = vec![0u8; 1 << 20];
            while let Ok(k) = c.read(&mut b) {
                if k == 0 {
                    break;
                }
                n += k as u64;
            }
        }
        n
    });
    let mut sock = TcpStream::connect(addr).map_err(|e| err("sink", e))?;
    let t0 = Instant::now();
    let mut buf = vec![0u8; 256 << 10];
    let total = bytes.min(s.len);
    let mut done = 0;
    while done < total {
        check_stop()?;
        let n = (buf.len() as u64).min(total - done);
        for p in v.geometry().map(s.start + done, n) {
            files[usize::from(p.component)]
                .read_exact_at(&mut buf[p.at as usize..(p.at + p.len) as usize], p.offset)
                .map_err(|e| err("pread", e))?;
        }
        sock.write_all(&buf[..n as usize]).map_err(|e| err("send", e))?;
        done += n;
    }
    drop(sock);
    let got = sink.join().unwrap_or(0);
    let secs = t0.elapsed().as_secs_f64();
    if got != total {
        return Err(err("read/send", format!("sink got {got} of {total} bytes")));
    }
    Ok(total as f64 / secs)
}

/// The engine as the tables run it: its thread at `SCHED_FIFO` (if permitted), as
/// nginx is run with `chrt`; downloads on the paper's path (`O_DIRECT` into the
/// registered buffers, every device read queued by DRR) rather than spliced from the
/// page cache, whose read-ahead reads would reach the device beside DRR's queue. The
/// spliced path is measured in the HTTP part.
fn engine() -> EngineConfig {
    EngineConfig { fifo: Some(ENGINE_FIFO), splice: false, ..EngineConfig::default() }
}

/// Table 1: read/send against stream read/send, one disk and striped over two.
pub fn table1(l: &Layout, quick: bool, out: &mut Out) -> Result<(), BenchError> {
    let bytes: u64 = if quick { 48 << 20 } else { 256 << 20 };
    let rounds = if quick { 1 } else { 3 };
    let mut runs: Vec<(&str, &str, Vec<f64>)> = vec![
        ("read/send", "single", vec![]),
        ("stream read/send", "single", vec![]),
        ("read/send", "striped", vec![]),
        ("stream read/send", "striped", vec![]),
    ];
    for round in 0..rounds {
        let n = runs.len();
        for i in (0..n).map(|i| (i + round) % n) {
            check_stop()?;
            let (method, layout, _) = runs[i];
            let comps = if layout == "single" { &l.single } else { &l.striped };
            let r = if method == "read/send" {
                read_send(comps, "clip.bin", bytes)?
            } else {
                let cap = l.rate * comps.len() as f64;
                let server = serve(comps, cap, EngineConfig { device_depth: 8, window: 8, ..engine() })?;
                let got = client::get(
                    port_of(&server),
                    "clip.bin",
                    Pull::Download { limit: Some(bytes) },
                    Duration::from_secs(600),
                )?;
                server.stop();
                got.bytes as f64 / got.elapsed.as_secs_f64()
            };
            runs[i].2.push(r);
        }
    }
    for (method, layout, r) in &runs {
        out.rows.push(json!({
            "case": format!("Table 1: {method}, {layout}"),
            "table": 1, "method": method, "layout": layout,
            "mb_s": med(r) / 1e6, "min_mb_s": r.iter().copied().fold(f64::INFINITY, f64::min) / 1e6,
            "max_mb_s": r.iter().copied().fold(0.0, f64::max) / 1e6, "runs": r.len(),
        }));
    }
    let (single, striped) = (med(&runs[1].2), med(&runs[3].2));
    out.headline.push(
        Headline::new(
            "mars_striped_vs_single",
            striped / 1e6,
            single / 1e6,
            "stream read/send on one disk",
            "MB/s",
            Better::Higher,
        )
        .with_target(1.6),
    );
    out.figures.push(
        PaperFigure::new(
            "stream read/send, striped over 2 disks",
            "17.65 MB/s (+60 % over one disk)",
            Some(17.65),
            "MB/s",
            Better::Higher,
        )
        .ours(Some(striped / 1e6), format!("{:.1} MB/s ({:.2}× one disk)", striped / 1e6, striped / single.max(1.0))),
    );
    out.figures.push(
        PaperFigure::new("read/send, one disk", "10.90 MB/s", Some(10.9), "MB/s", Better::Higher)
            .ours(Some(med(&runs[0].2) / 1e6), format!("{:.1} MB/s", med(&runs[0].2) / 1e6)),
    );
    out.notes.push(format!(
        "Table 1: {} MiB per run, {rounds} round(s) rotating the order; read/send = pread of the stripe pieces (256 KiB, page cache dropped first) and send; stream read/send = ictus mars over HTTP (O_DIRECT into registered buffers, zero-copy send, 8 reads in flight per disk)",
        bytes >> 20
    ));
    Ok(())
}

/// Who serves the stream in a Table 2 run, and how the background reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    /// Our server, the disk at mq-deadline, fio readers at their default priority.
    Ours,
    /// Our server with the kernel's help nginx gets: BFQ, the engine at `ionice -c1`.
    OursBfqRt,
    /// Our server, the background as downloads through it (DRR's non-real-time class).
    OursDrr,
    /// nginx (sendfile), mq-deadline.
    NginxDeadline,
    /// nginx, BFQ, `ionice -c1`.
    NginxBfqRt,
    /// nginx, BFQ with `strict_guarantees` (what BFQ's documentation advises where a
    /// low drop rate matters more than throughput, video streaming its example),
    /// `ionice -c1`.
    NginxBfqStrict,
}

impl Who {
    const ALL: [Who; 6] =
        [Who::Ours, Who::NginxDeadline, Who::OursDrr, Who::NginxBfqRt, Who::OursBfqRt, Who::NginxBfqStrict];

    fn name(self) -> &'static str {
        match self {
            Who::Ours => "ictus mars, mq-deadline (fio readers)",
            Who::OursBfqRt => "ictus mars, BFQ + ionice -c1 engine (fio readers)",
            Who::OursDrr => "ictus mars, readers as downloads through its DRR",
            Who::NginxDeadline => "nginx sendfile, mq-deadline (fio readers)",
            Who::NginxBfqRt => "nginx sendfile, BFQ + ionice -c1 (fio readers)",
            Who::NginxBfqStrict => "nginx sendfile, BFQ strict_guarantees + ionice -c1 (fio readers)",
        }
    }

    fn scheduler(self) -> &'static str {
        match self {
            Who::OursBfqRt | Who::NginxBfqRt | Who::NginxBfqStrict => "bfq",
            _ => "mq-deadline",
        }
    }

    /// Whether BFQ runs with `strict_guarantees`.
    fn strict(self) -> bool {
        self == Who::NginxBfqStrict
    }

    fn ours(self) -> bool {
        matches!(self, Who::Ours | Who::OursBfqRt | Who::OursDrr)
    }
}

/// One condition's runs.
struct Cell {
    who: Who,
    k: usize,
    /// The stream's rate, as a fraction of the disk's.
    frac: f64,
    judged: Vec<Judged>,
    /// Each run's stream, background and disk over the stream's window.
    windows: Vec<Window>,
    /// fio's own figure for each run (over its whole run, not the window), for
    /// comparison with the windowed one.
    fio_own: Vec<f64>,
    /// Why a run's numbers cannot all be true ([`Window::impossible`]), per run.
    impossible: Vec<Option<String>>,
    /// Our engine's read-ahead at the end of each run: (largest window, most reads
    /// needed in flight beyond the base depth, worst device latency ns, longest
    /// pre-roll ns).
    engine: Vec<(u64, u64, u64, u64)>,
}

impl Cell {
    /// The background left over the runs where the stream held and the accounting is
    /// possible (median, bytes/s), if the stream held in at least half the runs; a run
    /// that broke the stream's guarantee counts as a run without background left.
    fn credited(&self) -> Option<f64> {
        let ok: Vec<f64> = self
            .judged
            .iter()
            .zip(&self.windows)
            .zip(&self.impossible)
            .filter(|((j, _), e)| j.held && e.is_none())
            .map(|((_, w), _)| w.background)
            .collect();
        (!ok.is_empty() && 2 * ok.len() >= self.judged.len()).then(|| med(&ok))
    }
}

/// The stream, in a thread at `SCHED_FIFO` (it measures); its result when joined.
fn play(
    port: u16,
    path: String,
    rate: f64,
    chunk: u64,
    window: u64,
    deadline: Duration,
) -> std::thread::JoinHandle<Result<client::Received, BenchError>> {
    std::thread::spawn(move || {
        client::measuring_thread(CLIENT_FIFO);
        client::get(port, &path, Pull::Player { rate, chunk, window }, deadline)
    })
}

/// Plays the stream and returns what the player received, and when its request was
/// sent (within microseconds: the player's marks count from there).
fn play_timed(
    port: u16,
    path: String,
    rate: f64,
    chunk: u64,
    window: u64,
    deadline: Duration,
) -> Result<(Instant, client::Received), BenchError> {
    let sent = Instant::now();
    let got = play(port, path, rate, chunk, window, deadline).join().map_err(|_| err("player", "panicked"))??;
    Ok((sent, got))
}

/// Waits until the background readers have read something (at most 10 s), so that the
/// stream starts among readers already running.
fn until_reading(k: usize, source: &mut Source) -> Result<(), BenchError> {
    let end = Instant::now() + Duration::from_secs(10);
    while k > 0 && source() == 0 {
        if Instant::now() > end {
            return Err(err("Table 2", "the background readers read nothing in 10 s"));
        }
        rig::nap(Duration::from_millis(5))?;
    }
    Ok(())
}

/// The run's accounting over the stream's window (the player's first body byte to the
/// byte that completed its window).
fn over_window(sent: Instant, got: &client::Received, window: u64, series: &account::Series) -> Window {
    let (from, to) = client::window_ns(got, window);
    let (from, to) = (sent + Duration::from_nanos(from), sent + Duration::from_nanos(to));
    let secs = to.saturating_duration_since(from).as_secs_f64().max(1e-9);
    let (background, disk) = series.rates(from, to);
    let sampled = series.covers(from, to) && series.widest_gap(from, to) <= account::MAX_GAP;
    Window { sampled, stream: got.bytes.min(window) as f64 / secs, background, disk }
}

/// The stream's share of the disk in Table 2's main sweep, and in its high-rate cells.
const LOW: f64 = 0.4;
const MID: f64 = 0.6;
const HIGH: f64 = 0.75;
/// The shares `mars_bg_vs_bfq` may compare at, highest first: the sweep's, then the
/// ladder below it ([`LADDER`]).
const SHARES_BG: [f64; 5] = [HIGH, MID, LOW, LADDER[0], LADDER[1]];
/// Shares run for ours through DRR and nginx + BFQ + `ionice -c1` only when no higher
/// share has both holding the stream (so that the background comparison has a cell),
/// highest first; one at a time, stopping at the first where both hold.
const LADDER: [f64; 2] = [0.2, 0.1];

/// Runs of each of the two conditions `mars_bg_vs_bfq` compares, at the share it
/// compares at (a quick run's one round per cell gets the rest there).
const CONFIRMED_RUNS: usize = 3;

/// What Table 2 runs next for the background comparison once the planned cells are
/// done.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Next {
    /// More runs at the highest share that compares, which has not had them.
    Confirm(f64),
    /// The ladder's next share, as no share compares.
    Rung(f64),
}

/// The background comparison's next cells: the highest share that compares
/// (`comparable`) gets its confirming runs if it has not had them (`confirm`: a quick
/// run's one round per cell; `confirmed`: the shares that had them) — and should
/// those runs leave it no longer comparable, the next share that compares gets them
/// in turn; while no share compares, the ladder's next rung not yet run (`run`).
/// `None`: settled, or the ladder's end. Each share is confirmed once and each rung
/// run once, so the cells added are bounded.
fn next_cells(comparable: impl Fn(f64) -> bool, run: &[f64], confirmed: &[f64], confirm: bool) -> Option<Next> {
    match SHARES_BG.iter().copied().find(|&f| comparable(f)) {
        Some(f) => (confirm && !confirmed.contains(&f)).then_some(Next::Confirm(f)),
        None => LADDER.iter().copied().find(|f| !run.contains(f)).map(Next::Rung),
    }
}

/// The peer's configurations in the background comparison: BFQ as it comes, and BFQ
/// as its documentation advises for streaming (`strict_guarantees`); nginx at
/// `ionice -c1` in both.
const BFQ_PEERS: [Who; 2] = [Who::NginxBfqRt, Who::NginxBfqStrict];

/// The background `who`'s cell at share `f` under `k` readers left, if the cell counts
/// ([`Cell::credited`]).
fn credited_at(cells: &[Cell], who: Who, k: usize, f: f64) -> Option<f64> {
    cells.iter().find(|c| c.who == who && c.k == k && c.frac == f).and_then(Cell::credited)
}

/// The peer's better configuration among those whose cell at share `f` counts, with
/// the background it left.
fn peer_best(cells: &[Cell], k: usize, f: f64) -> Option<(Who, f64)> {
    BFQ_PEERS.iter().filter_map(|&w| credited_at(cells, w, k, f).map(|b| (w, b))).max_by(|a, b| a.1.total_cmp(&b.1))
}

/// Whether the background comparison can be made at share `f`: ours through DRR and
/// the peer in either configuration held the stream there (in at least half their
/// runs).
fn compares(cells: &[Cell], k: usize, f: f64) -> bool {
    credited_at(cells, Who::OursDrr, k, f).is_some() && peer_best(cells, k, f).is_some()
}

/// Table 2: one real-time stream at 40 % of a disk under 0–4 background readers, and at
/// 75 % under the most readers.
///
/// What 001 §5.2 claims is that priority queueing keeps a real-time stream's rate under
/// any background load while no class starves (DRR); it measured the stream only. What
/// the background is left matters only where the stream takes most of the disk — at
/// 40 % any scheduler that protects the stream leaves about disk − stream to the rest —
/// so the background comparison (`mars_bg_vs_bfq`) is made at a 75 % stream: ours
/// with the readers as downloads through our server's DRR (the paper's setting, every
/// read in one queue), beside nginx with BFQ and `ionice -c1` and fio readers (the
/// kernel's best offer to a stock server); each with whether the stream held.
pub fn table2(rig: &mut Rig, l: &Layout, quick: bool, out: &mut Out) -> Result<(), BenchError> {
    let rate = l.rate;
    let secs: f64 = if quick { 4.0 } else { 10.0 };
    let chunk: u64 = 256 << 10;
    let ks: Vec<usize> = if quick { vec![0, 4] } else { vec![0, 1, 2, 3, 4] };
    let kmax = *ks.last().unwrap_or(&0);
    let rounds = if quick { 1 } else { 3 };
    const HIGH_WHO: [Who; 5] = [Who::OursDrr, Who::NginxBfqRt, Who::OursBfqRt, Who::NginxDeadline, Who::NginxBfqStrict];
    const MID_WHO: [Who; 3] = [Who::OursDrr, Who::NginxBfqRt, Who::NginxBfqStrict];
    // (stream share, readers, conditions, rounds), in the order run.
    let mut plan: Vec<(f64, usize, &[Who], usize)> = ks.iter().map(|&k| (LOW, k, &Who::ALL[..], rounds)).collect();
    plan.push((MID, kmax, &MID_WHO[..], rounds));
    plan.push((HIGH, kmax, &HIGH_WHO[..], rounds));
    // The shares `mars_bg_vs_bfq` compared at that have had their confirming rounds.
    let mut confirmed: Vec<f64> = Vec::new();
    let dev0 = l.single[0].to_string_lossy().into_owned();
    // fio reads beyond the two clips on our disk, and the second half of nginx's.
    // fio runs until stopped after the stream's window (its runtime is only a limit).
    let ours_bg = Readers { k: 0, offset: 2 * l.clip_len + (64 << 20), span: 0, secs: secs * 3.0 + 20.0 };
    let ours_bg = Readers { span: rig::size_of(&dev0).saturating_sub(ours_bg.offset), ..ours_bg };
    let www_size = rig::size_of(&l.www_dev);
    let www_bg = Readers { k: 0, offset: www_size / 2, span: www_size / 2 - (16 << 20), secs: secs * 3.0 + 20.0 };
    // Admission from the volume's measured capability, measured once.
    let storage = crate::LocalStorage::open(&l.single).map_err(|e| err("volume", e))?;
    let capability = crate::measure::capability(&storage, 4, Duration::from_millis(1500))
        .map_err(|e| err("measuring the volume", e))?;
    drop(storage);
    let mut cells: Vec<Cell> = Vec::new();
    let mut next = 0;
    while next < plan.len() {
        let (frac, k, whos, reps) = plan[next];
        next += 1;
        let stream_rate = rate * frac;
        // A stream plays at most the clip: a 75 % stream of the quick run's clip ends
        // before the run would, and its missing tail counted as late slots (so no
        // condition could hold) while the readers had the disk to themselves. The run,
        // the readers and the background measured all last what the stream can play.
        let secs = secs.min(0.95 * l.clip_len as f64 / stream_rate);
        let window = (stream_rate * secs) as u64;
        for round in 0..reps {
            let mut order = whos.to_vec();
            order.rotate_left(round % whos.len());
            for who in order {
                check_stop()?;
                let dev = if who.ours() { dev0.clone() } else { l.www_dev.clone() };
                let lower = if who.ours() { l.single_lower.clone() } else { l.www_lower.clone() };
                rig::set_scheduler(&dev, who.scheduler())?;
                if who.scheduler() == "bfq" {
                    rig::set_bfq_strict(&dev, who.strict())?;
                }
                rig::drop_cache(Path::new(&dev));
                rig::drop_cache(&l.www.join("clip.bin"));
                let fio_out = rig.dir.join(format!("fio-{k}-{round}-{who:?}-{}.json", (frac * 100.0) as u32));
                let mark = rig.mark();
                let deadline = Duration::from_secs_f64(secs * 3.0 + 10.0);
                let measured = (|| -> Result<_, BenchError> {
                    Ok(match who {
                        Who::Ours | Who::OursBfqRt => {
                            let ioprio = (who == Who::OursBfqRt).then_some((1, 0));
                            let server = serve(&l.single, capability, EngineConfig { ioprio, ..engine() })?;
                            let port = port_of(&server);
                            let fio =
                                rig::start_fio(rig, &dev, &Readers { k, ..ours_bg }, Priority::default(), &fio_out)?;
                            let mut source: Source = fio
                                .map_or_else(|| Box::new(|| 0u64) as Source, |f| account::tree_reader(rig.pid(f), k));
                            until_reading(k, &mut source)?;
                            let sampler = Sampler::start(source, &lower);
                            let (sent, got) = play_timed(
                                port,
                                format!("clip.bin?rate={}", stream_rate as u64),
                                stream_rate,
                                chunk,
                                window,
                                deadline,
                            )?;
                            let series = sampler.finish();
                            if let Some(f) = fio {
                                rig.stop_child(f);
                            }
                            let seen = engine_seen(&server);
                            server.stop();
                            let w = over_window(sent, &got, window, &series);
                            (got, w, fio.map(|_| rig::fio_bw(&fio_out)), Some(seen))
                        }
                        Who::OursDrr => {
                            // The background readers are clients of the server: full-speed
                            // downloads of another stream, each from its own part (again
                            // from there if it reaches the end), queued by DRR in the
                            // non-real-time class, as 001 §5.2's background read()s went to
                            // the NRTQ.
                            let server = serve(&l.single, capability, engine())?;
                            let port = port_of(&server);
                            let part = l.clip_len / k.max(1) as u64;
                            let meter = std::sync::Arc::new(Meter::default());
                            let downloads: Vec<_> = (0..k as u64)
                                .map(|i| {
                                    let m = std::sync::Arc::clone(&meter);
                                    std::thread::spawn(move || -> Result<(), BenchError> {
                                        while !m.stop.load(std::sync::atomic::Ordering::Relaxed) {
                                            client::get_range_metered(port, "bg.bin", i * part, deadline, &m)?;
                                        }
                                        Ok(())
                                    })
                                })
                                .collect();
                            let m = std::sync::Arc::clone(&meter);
                            let mut source: Source =
                                Box::new(move || m.bytes.load(std::sync::atomic::Ordering::Relaxed));
                            let started = until_reading(k, &mut source);
                            let played = started.and_then(|()| {
                                let sampler = Sampler::start(source, &lower);
                                let r = play_timed(
                                    port,
                                    format!("clip.bin?rate={}", stream_rate as u64),
                                    stream_rate,
                                    chunk,
                                    window,
                                    deadline,
                                );
                                r.map(|(sent, got)| (sent, got, sampler.finish()))
                            });
                            meter.stop.store(true, std::sync::atomic::Ordering::Relaxed);
                            for d in downloads {
                                d.join().map_err(|_| err("download", "panicked"))??;
                            }
                            let (sent, got, series) = played?;
                            let seen = engine_seen(&server);
                            server.stop();
                            let w = over_window(sent, &got, window, &series);
                            (got, w, None, Some(seen))
                        }
                        Who::NginxDeadline | Who::NginxBfqRt | Who::NginxBfqStrict => {
                            let io = (who != Who::NginxDeadline).then_some((1, 0));
                            let port = rig::free_port()?;
                            rig::start_nginx(rig, &l.www, port, Priority { fifo: Some(ENGINE_FIFO), io })?;
                            let fio =
                                rig::start_fio(rig, &dev, &Readers { k, ..www_bg }, Priority::default(), &fio_out)?;
                            let mut source: Source = fio
                                .map_or_else(|| Box::new(|| 0u64) as Source, |f| account::tree_reader(rig.pid(f), k));
                            until_reading(k, &mut source)?;
                            let sampler = Sampler::start(source, &lower);
                            let (sent, got) =
                                play_timed(port, "clip.bin".into(), stream_rate, chunk, window, deadline)?;
                            let series = sampler.finish();
                            if let Some(f) = fio {
                                rig.stop_child(f);
                            }
                            let w = over_window(sent, &got, window, &series);
                            (got, w, fio.map(|_| rig::fio_bw(&fio_out)), None)
                        }
                    })
                })();
                rig.stop_since(mark);
                let (received, w, fio_own, engine_seen) = match measured {
                    Ok(m) => m,
                    // The added high-rate cells may fail where the sweep would not (a
                    // refused admission, a player that gave up): said, not fatal.
                    Err(e) if frac != LOW && !rig::stopped() => {
                        out.notes.push(format!("Table 2: {} at {:.0} %, {k} readers: {e}", who.name(), frac * 100.0));
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let j = judge(&received, stream_rate, chunk, window);
                let cell = match cells.iter_mut().position(|c| c.who == who && c.k == k && c.frac == frac) {
                    Some(i) => &mut cells[i],
                    None => {
                        cells.push(Cell {
                            who,
                            k,
                            frac,
                            judged: vec![],
                            windows: vec![],
                            fio_own: vec![],
                            impossible: vec![],
                            engine: vec![],
                        });
                        cells.last_mut().expect("just pushed")
                    }
                };
                cell.judged.push(j);
                cell.windows.push(w);
                cell.fio_own.extend(fio_own);
                cell.impossible.push(w.impossible(capability, rate));
                cell.engine.extend(engine_seen);
            }
        }
        if next == plan.len() {
            // The planned cells are run: a share compares where ours through DRR and
            // nginx + BFQ + RT in either configuration held the stream. While none
            // does, the ladder's next share; once one does, more runs there so that
            // each side's background is a median over runs (the peer's varies from
            // run to run: nginx + BFQ + RT left the readers 13.6-32.0 MB/s beside the
            // same 20 % stream in six quick runs).
            let comparable = |f: f64| compares(&cells, kmax, f);
            let run: Vec<f64> = plan.iter().map(|p| p.0).collect();
            match next_cells(comparable, &run, &confirmed, rounds < CONFIRMED_RUNS) {
                Some(Next::Rung(f)) => plan.push((f, kmax, &MID_WHO[..], rounds)),
                Some(Next::Confirm(f)) => {
                    plan.push((f, kmax, &MID_WHO[..], CONFIRMED_RUNS - rounds));
                    confirmed.push(f);
                }
                None => {}
            }
        }
    }
    for &f in &confirmed {
        let still = compares(&cells, kmax, f);
        out.notes.push(format!(
            "Table 2: {:.0} % was the highest share where ours through DRR and nginx + BFQ + ionice -c1 (in one of BFQ's two configurations at least) held the stream, so the three conditions ran there {CONFIRMED_RUNS} times in all; {}",
            f * 100.0,
            if still {
                "mars_bg_vs_bfq is taken over those runs"
            } else {
                "over them one side no longer held in half its runs, so the comparison moved to a lower share"
            }
        ));
    }
    for c in &cells {
        let mut rec = LatencyRecorder::new();
        for j in &c.judged {
            rec.record_all(&j.lateness);
        }
        let held = c.judged.iter().filter(|j| j.held).count() as u64;
        let valid = |f: fn(&Window) -> f64| -> Vec<f64> {
            c.windows.iter().zip(&c.impossible).filter(|(_, e)| e.is_none()).map(|(w, _)| f(w)).collect()
        };
        let mut row = rec
            .row(format!("Table 2: {}, {} background, stream {:.0} % of the disk", c.who.name(), c.k, c.frac * 100.0))
            .with("table", 2)
            .with("implementation", c.who.name())
            .with("background_readers", c.k as u64)
            .with("stream_share", c.frac)
            .with("stream_mb_s_target", rate * c.frac / 1e6)
            .with("stream_mb_s", med(&c.judged.iter().map(|j| j.achieved).collect::<Vec<_>>()) / 1e6)
            .with("held_runs", held)
            .with("runs", c.judged.len() as u64)
            .with("late_slots", c.judged.iter().map(|j| j.late).sum::<u64>())
            .with("slots", c.judged.iter().map(|j| j.slots).sum::<u64>())
            .with("max_lateness_ns", c.judged.iter().map(|j| j.worst).max().unwrap_or(0))
            .with("first_byte_ms_max", c.judged.iter().map(|j| j.first_byte_ns).max().unwrap_or(0) as f64 / 1e6)
            .with("background_mb_s", med(&valid(|w| w.background)) / 1e6)
            .with("background_mb_s_held", c.credited().map_or(f64::NAN, |b| b / 1e6))
            .with("stream_plus_background_mb_s", med(&valid(|w| w.stream + w.background)) / 1e6)
            .with("disk_mb_s", med(&valid(|w| w.disk)) / 1e6)
            .with("accounting_errors", c.impossible.iter().flatten().count() as u64);
        if !c.fio_own.is_empty() {
            row = row.with("fio_own_mb_s", med(&c.fio_own) / 1e6);
        }
        if let Some(&(w, need, lat, _)) = c.engine.iter().max_by_key(|e| e.2) {
            row = row
                .with("readahead_chunks_max", w)
                .with("rt_reads_in_flight_max", need)
                .with("device_latency_ms_max", lat as f64 / 1e6)
                .with("preroll_ms_max", c.engine.iter().map(|e| e.3).max().unwrap_or(0) as f64 / 1e6);
        }
        out.rows.push(row.to_value());
        for (i, e) in c.impossible.iter().enumerate() {
            if let Some(e) = e {
                out.notes.push(format!(
                    "ERROR: Table 2 accounting, {} at {:.0} % with {} readers, run {}: {e}; the run's background is left out of every figure",
                    c.who.name(),
                    c.frac * 100.0,
                    c.k,
                    i + 1
                ));
            }
        }
    }
    let find_at = |w: Who, frac: f64| cells.iter().find(|c| c.who == w && c.k == kmax && c.frac == frac);
    let held_at = |w: Who, frac: f64| {
        find_at(w, frac)
            .map_or(0.0, |c| c.judged.iter().filter(|j| j.held).count() as f64 / c.judged.len().max(1) as f64)
    };
    let held = |w: Who| held_at(w, LOW);
    let mut h = Headline::new(
        "mars_rt_held_4bg",
        held(Who::Ours),
        held(Who::NginxDeadline),
        "nginx sendfile with mq-deadline: fraction of runs holding the rate",
        "fraction of runs",
        Better::Higher,
    );
    h.target = Some(1.0);
    h.met = Some(held(Who::Ours) >= 1.0);
    out.headline.push(h);
    let mut h = Headline::new(
        "mars_rt_held_4bg_drr",
        held(Who::OursDrr),
        held(Who::NginxDeadline),
        "nginx sendfile with mq-deadline under fio readers: fraction of runs holding the rate",
        "fraction of runs",
        Better::Higher,
    );
    h.target = Some(1.0);
    h.met = Some(held(Who::OursDrr) >= 1.0);
    out.headline.push(h);
    // Background left, compared only where both streams held: the highest share at
    // which ours through DRR and nginx + BFQ + RT (in either of BFQ's configurations)
    // held in at least half their runs, each side's background the median over the
    // runs that held (a run that broke the stream's guarantee earns nothing: a peer
    // must not look better for breaking it); the peer's figure is the better of its
    // configurations that held there.
    let credited = |w: Who, f: f64| credited_at(&cells, w, kmax, f);
    let both = SHARES_BG.iter().copied().find(|&f| compares(&cells, kmax, f));
    let (ours_bg, (peer, peer_bg), at) = match both {
        Some(f) => {
            (credited(Who::OursDrr, f).unwrap_or(0.0), peer_best(&cells, kmax, f).unwrap_or((Who::NginxBfqRt, 0.0)), f)
        }
        // Nowhere comparable: ours at the highest share, the peer's credited 0, so the
        // ratio is undefined (NaN) and the target not met.
        None => (credited(Who::OursDrr, HIGH).unwrap_or(0.0), (Who::NginxBfqRt, 0.0), HIGH),
    };
    let held_said = |w: Who| format!("{:.0} %", held_at(w, at) * 100.0);
    out.headline.push(
        Headline::new(
            "mars_bg_vs_bfq",
            ours_bg / 1e6,
            peer_bg / 1e6,
            format!(
                "background left beside a {:.0} % stream under {kmax} readers, over the runs where the stream held (at the highest of {} % where both held in at least half their runs, the {} % cells run only where no higher share had both holding{}): ours with the readers as downloads through its DRR (held in {}), nginx sendfile + ionice -c1 with fio readers and BFQ as it comes (held in {}) or with strict_guarantees as BFQ's documentation advises for streaming (held in {}), the better of the two that held: {}",
                at * 100.0,
                SHARES_BG.iter().map(|f| format!("{:.0}", f * 100.0)).collect::<Vec<_>>().join("/"),
                LADDER.iter().map(|f| format!("{:.0}", f * 100.0)).collect::<Vec<_>>().join("/"),
                if both.is_none() { "; none: not comparable" } else { "" },
                held_said(Who::OursDrr),
                held_said(Who::NginxBfqRt),
                held_said(Who::NginxBfqStrict),
                if both.is_some() { if peer.strict() { "strict_guarantees" } else { "as it comes" } } else { "none" }
            ),
            "MB/s",
            Better::Higher,
        )
        .with_target(2.0),
    );
    if both.is_none() {
        out.notes.push(format!(
            "mars_bg_vs_bfq: at no share of {} % did both ours (through DRR) and nginx + BFQ + ionice -c1 (either configuration) hold the stream in at least half their runs, so there is no background to compare at the same guarantee (ratio undefined, not met)",
            SHARES_BG.iter().map(|f| format!("{:.0}", f * 100.0)).collect::<Vec<_>>().join("/")
        ));
    }
    out.headline.push(Headline::new(
        "mars_bg_vs_bfq_40",
        credited(Who::Ours, LOW).unwrap_or(0.0) / 1e6,
        credited(Who::NginxBfqRt, LOW).unwrap_or(0.0) / 1e6,
        format!(
            "background left beside a {:.0} % stream under {kmax} fio readers over the runs where the stream held (none held: 0): ours with mq-deadline, nginx + BFQ + ionice -c1",
            LOW * 100.0
        ),
        "MB/s",
        Better::Higher,
    ));
    let said_at = |w: Who, frac: f64| {
        find_at(w, frac).map_or("not run".into(), |c| {
            format!(
                "{}/{} held, {} late, {:.1} MB/s left{}",
                c.judged.iter().filter(|j| j.held).count(),
                c.judged.len(),
                c.judged.iter().map(|j| j.late).sum::<u64>(),
                med(&c
                    .windows
                    .iter()
                    .zip(&c.impossible)
                    .filter(|(_, e)| e.is_none())
                    .map(|(w, _)| w.background)
                    .collect::<Vec<_>>())
                    / 1e6,
                match c.impossible.iter().flatten().count() {
                    0 => String::new(),
                    n => format!(" ({n} run(s) with impossible accounting left out)"),
                }
            )
        })
    };
    let said = |w: Who| said_at(w, LOW);
    for &f in LADDER.iter().filter(|&&f| plan.iter().any(|p| p.0 == f)) {
        out.notes.push(format!(
            "Table 2: no higher share had both ours through DRR and nginx + BFQ + ionice -c1 holding the stream, so a {:.0} % stream under {kmax} readers was run for those: through our DRR: {}; nginx + BFQ + RT: {}; nginx + BFQ strict_guarantees + RT: {}",
            f * 100.0,
            said_at(Who::OursDrr, f),
            said_at(Who::NginxBfqRt, f),
            said_at(Who::NginxBfqStrict, f)
        ));
    }
    out.figures.push(
        PaperFigure::new(
            format!("real-time stream under {kmax} background readers"),
            "stream time ≈ 21–22 s with or without load (normal read/send: 21 s → 567 s)",
            None,
            "",
            Better::Higher,
        )
        .ours(
            None,
            format!(
                "ours: {}; through our DRR: {}; nginx+mq-deadline: {}; nginx+BFQ+RT: {}; nginx+BFQ strict+RT: {}",
                said(Who::Ours),
                said(Who::OursDrr),
                said(Who::NginxDeadline),
                said(Who::NginxBfqRt),
                said(Who::NginxBfqStrict)
            ),
        ),
    );
    out.figures.push(
        PaperFigure::new(
            format!("a {:.0} % stream under {kmax} background readers", HIGH * 100.0),
            "(not in the paper: it measured the stream only)",
            None,
            "",
            Better::Higher,
        )
        .ours(
            None,
            format!(
                "through our DRR: {}; ours + BFQ + RT (fio): {}; nginx+BFQ+RT: {}; nginx+BFQ strict+RT: {}; nginx+mq-deadline: {}",
                said_at(Who::OursDrr, HIGH),
                said_at(Who::OursBfqRt, HIGH),
                said_at(Who::NginxBfqRt, HIGH),
                said_at(Who::NginxBfqStrict, HIGH),
                said_at(Who::NginxDeadline, HIGH)
            ),
        ),
    );
    let high_secs = secs.min(0.95 * l.clip_len as f64 / (rate * HIGH));
    out.notes.push(format!(
        "Table 2: a stream of {:.1} MB/s ({:.0} % of the disk; {:.1} MB/s = {:.0} % in the high-rate cells and {:.0} % for ours through DRR and nginx + BFQ + RT, {kmax} readers; BFQ as it comes and, as its documentation advises for streaming, with strict_guarantees (it then idles whenever the stream's queue empties and sends the device one request at a time), for {high_secs:.1} s: the clip) ({} KiB slots) for {secs} s on a {:.0} MB/s disk, {rounds} run(s) per cell rotating the order; background: fio, one job per reader, sequential 128 KiB O_DIRECT reads, libaio depth 8, at their default I/O priority, from beyond the clips on the same disk (or, for 'through its DRR', that many full-speed downloads from our server), started first and stopped after the stream; background throughput = what the readers read during the stream's window (first body byte to the end of its window: fio's processes' read_bytes, the downloads' bytes received), sampled every 20 ms, beside the throttled device's own count; a run the sampler did not see whole, or whose stream + background exceeds the device's count or the disk (measured capability or throttle, the larger), or whose device count exceeds the throttle, by more than {margin:.0} %, is an accounting error and left out; the player (SCHED_FIFO {CLIENT_FIFO}) pulls at the stream rate with one slot of buffer and starts its clock at the first body byte; a slot is late if its last byte came more than one period after the player needed it; a run holds the rate if it delivered its window with at most 1 % of slots late. Our engine and nginx both run at SCHED_FIFO {ENGINE_FIFO}; admission from the volume's measured capability ({:.1} MB/s)",
        rate * LOW / 1e6,
        LOW * 100.0,
        rate * HIGH / 1e6,
        HIGH * 100.0,
        MID * 100.0,
        chunk >> 10,
        rate / 1e6,
        capability / 1e6,
        margin = account::MARGIN * 100.0
    ));
    Ok(())
}

/// Our engine's read-ahead over the run just measured.
fn engine_seen(server: &Running) -> (u64, u64, u64, u64) {
    server
        .handle
        .as_ref()
        .and_then(|h| h.stats())
        .map_or((0, 0, 0, 0), |s| (s.max_window, s.max_rt_need, s.max_latency_ns, s.max_preroll_ns))
}

/// Table 3: three streams paced by 60, 75 and 120 ms upcalls, on the striped volume.
pub fn table3(l: &Layout, quick: bool, out: &mut Out) -> Result<(), BenchError> {
    check_stop()?;
    let chunk: u64 = 256 << 10;
    let server = serve(&l.striped, l.rate * 2.0, engine())?;
    let port = port_of(&server);
    let secs = if quick { 3.0 } else { 20.0 };
    let players: Vec<_> = [60u64, 75, 120]
        .iter()
        .map(|&p| {
            let r = chunk as f64 / (p as f64 / 1000.0);
            let bytes = (r * secs) as u64;
            let h =
                play(port, format!("clip.bin?rate={}", r as u64), r, chunk, bytes, Duration::from_secs_f64(secs * 3.0));
            (p, r, bytes, h)
        })
        .collect();
    let mut late = 0;
    for (p, r, bytes, h) in players {
        let got = h.join().map_err(|_| err("table 3", "a player panicked"))??;
        let j = judge(&got, r, chunk, bytes);
        late += j.late;
        let mut rec = LatencyRecorder::new();
        rec.record_all(&j.lateness);
        out.rows.push(
            rec.row(format!("Table 3: stream paced by a {p} ms upcall"))
                .with("table", 3)
                .with("period_ms", p)
                .with("rate_mb_s", r / 1e6)
                .with("slots", j.slots)
                .with("late_slots", j.late)
                .with("max_lateness_ns", j.worst)
                .to_value(),
        );
    }
    server.stop();
    out.figures.push(
        PaperFigure::new(
            "deadline misses, streams paced by 60/75/120 ms upcalls",
            "none missed",
            Some(0.0),
            "late slots",
            Better::Lower,
        )
        .ours(Some(late as f64), format!("{late} late slots (as the players saw them, over {secs} s)")),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ladder goes down one rung at a time only while no share compares, and stops.
    #[test]
    fn the_ladder_runs_a_lower_share_only_while_none_compares() {
        let sweep = [LOW, MID, HIGH];
        let rung = |c: &dyn Fn(f64) -> bool, run: &[f64]| next_cells(c, run, &[], false);
        assert_eq!(rung(&|f| f == MID, &sweep), None, "60 % compares: nothing more");
        assert_eq!(rung(&|_| false, &sweep), Some(Next::Rung(0.2)));
        assert_eq!(rung(&|_| false, &[LOW, MID, HIGH, 0.2]), Some(Next::Rung(0.1)));
        assert_eq!(rung(&|f| f == 0.2, &[LOW, MID, HIGH, 0.2]), None, "20 % compares: stop");
        assert_eq!(rung(&|_| false, &[LOW, MID, HIGH, 0.2, 0.1]), None, "the ladder's end");
    }

    /// The share compared at is confirmed once; should its confirming runs leave it
    /// no longer comparable, the next share that compares is confirmed, or the ladder
    /// goes on; it never asks for the same cells twice.
    #[test]
    fn the_share_compared_at_is_confirmed_and_a_lost_one_hands_on() {
        let sweep = [LOW, MID, HIGH];
        assert_eq!(next_cells(|f| f <= MID, &sweep, &[], true), Some(Next::Confirm(MID)));
        assert_eq!(next_cells(|f| f <= MID, &sweep, &[MID], true), None, "confirmed and still compares");
        // 60 % lost its comparison in the confirming runs: 40 % is next.
        assert_eq!(next_cells(|f| f <= LOW, &sweep, &[MID], true), Some(Next::Confirm(LOW)));
        // Nothing of the sweep compares any more: down the ladder, then confirm there.
        assert_eq!(next_cells(|_| false, &sweep, &[MID, LOW], true), Some(Next::Rung(0.2)));
        assert_eq!(next_cells(|f| f == 0.2, &[LOW, MID, HIGH, 0.2], &[MID, LOW], true), Some(Next::Confirm(0.2)));
        assert_eq!(next_cells(|f| f == 0.2, &[LOW, MID, HIGH, 0.2], &[MID, LOW, 0.2], true), None);
        // A full run (three rounds per cell already) confirms nothing.
        assert_eq!(next_cells(|f| f <= MID, &sweep, &[], false), None);
        // Bounded: whatever `comparable` says, the loop that feeds confirmed shares and
        // run rungs back in ends within shares + rungs steps.
        let mut run = sweep.to_vec();
        let mut confirmed = vec![];
        let mut steps = 0;
        let flaky = |f: f64| (f * 100.0) as u32 % 20 == 0;
        while let Some(n) = next_cells(|f| flaky(f) && !confirmed.contains(&f), &run, &confirmed, true) {
            match n {
                Next::Confirm(f) => confirmed.push(f),
                Next::Rung(f) => run.push(f),
            }
            steps += 1;
            assert!(steps <= SHARES_BG.len() + LADDER.len(), "no end: {run:?} {confirmed:?}");
        }
    }
}
