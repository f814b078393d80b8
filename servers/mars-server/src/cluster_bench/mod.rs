//! `ictus bench mars-cluster` (issue 20): MARS across machines — stream nodes over one
//! Ceph cluster, placed by the director — against what a user would build without
//! ictus: nginx nodes, each with its own copy of the clips, behind an nginx
//! round-robin front.
//!
//! - **Scaling, offered load**: with 1, 2 and 4 nodes, each node is offered `per_node`
//!   paced players at `rate`, each from its own place in one of the clips; the rows say
//!   what the players received (the director's placement and the start times come from
//!   here). Ours and nginx alternate at each node count (A B A B), the counts rotating
//!   by round. Both deliver a paced load as long as they can at all, so a ratio of these
//!   aggregates is ~1 by construction; no headline comes from them.
//! - **Capacity** (measured): the paced streams offered rise rung by rung ([`Search`]:
//!   doubling from 1 per node, a failed rung run once more, then halving the gap) until
//!   a side no longer holds every one of them (from the players' view: the whole window,
//!   every byte right, no slot later than a player's startup buffer); a side's capacity
//!   is the aggregate of the most streams it held. Sides: ours at 1 node first, then ours
//!   and nginx at 4 nodes (their rungs interleaved) up to twice the 1-node capacity per
//!   node. Each node's link has a fixed rate (its NIC, [`LINK_BITS`]), so one node's
//!   capacity is its link; one unshaped rung says what the machine gives. Headlines `mars_cluster_vs_nginx` (ours / nginx
//!   at 4 nodes, goal ≥ 1.0) and `mars_cluster_scaling_4n` (ours at 4 nodes / 4 × ours
//!   at 1 node, goal ≥ 0.9).
//! - **Failover**: two nodes, a few streams; the node of the first stream is killed with
//!   SIGKILL mid-stream; each player cut off asks again (ours: the director, with its
//!   stream's id; nginx: the front) from the byte it reached. Resume = from the player
//!   seeing the cut to its first byte from the new node. Repeated, rounds of ours and
//!   nginx alternating. Headline `mars_failover_resume_ms` (p50; p99 in the rows).
//! - **Placement**: the director's redirect as the player sees it (HDR), and the core's
//!   time per placement.
//!
//! What stands in for machines: a network namespace and a shaped veth per node (its
//! network stack and NIC); every node, the Ceph daemons, nginx and the players share
//! this machine's cores and disk. Our nodes are separate processes (each
//! with its own engine, stripe cache and cluster connection); a node's capacity is its
//! admission limit, told to the director.
//!
//! Everything started — the Ceph cluster (`scripts/ceph.sh`, which also goes by its
//! own watcher if this process is killed), nodes, nginx, files — is stopped and
//! removed when the run ends, fails or is interrupted.

pub mod netns;
pub mod play;
pub mod procs;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ictus_bench::plot::{Axis, Plot, Scale, Series, TickFormat};
use ictus_bench::report::{Better, Headline, Notes, Report};
use ictus_bench::{BenchError, Conditions, Experiment, LatencyRecorder, Options, Outcome};
use ictus_mars_cluster::service::{Catalog, DirectorOptions, RunningDirector};
use ictus_objstore::testcluster::TestCluster;
use ictus_objstore::{Layout, Rados, Striper};
use serde_json::{json, Value};

use crate::bench::client::judge;
use crate::bench::rig::{self, check_stop, err, nap};
use play::{KillClock, Played, Stream, Via};
use procs::{NodeSpec, Place, Procs, NODE_ROLE};

/// Each node's link, bits/s each way (its NIC; [`netns::Net::shape`]). 320 Mbit/s
/// (40 MB/s, ~19 paced streams of 2 MB/s): 4 links are 160 MB/s, under a third of what
/// this 2-core machine delivered to 4 unshaped nodes at low load (≥ 512 MB/s, the
/// search's top) and at most what it delivered on the loaded runs of earlier sessions
/// (128–192 MB/s at load 10–30), so that the links and not the shared cores bound
/// each node; doc/mars-cluster.md "Per-node links".
const LINK_BITS: u64 = 320_000_000;

/// `ictus bench mars-cluster`.
pub static MARS_CLUSTER: Experiment = Experiment {
    name: "mars-cluster",
    about: "MARS across machines (issue 20): stream nodes over one Ceph cluster behind the director, 1/2/4 \
            nodes' aggregate stream throughput, resume time after kill -9 of a node, placement cost, against \
            nginx nodes with their own copies behind an nginx round-robin front",
    figures: &[],
    quick_s: 270.0,
    full_s: 1100.0,
    roles: &[&NODE_ROLE],
    args: ictus_bench::experiment::no_args,
    run,
};

/// Where in the papers.
pub const PAPER: &str = "001 §1-2 (a cluster of PCs), issue 20";

/// The run's sizes.
#[derive(Clone, Copy, Debug)]
struct Plan {
    rate: u64,
    per_node: usize,
    chunk: u64,
    window: u64,
    clips: usize,
    clip_len: usize,
    rounds: usize,
    failover_rounds: usize,
    failover_streams: usize,
    /// A failover stream's window (long: nginx's buffers must not hold its rest).
    failover_window: u64,
    /// Players stop this long after the kill.
    after_kill: Duration,
    cache: u64,
    ahead: u64,
    /// Capacity: the most streams per node tried at 4 nodes (1 node goes to 4 × this).
    top: usize,
    /// Capacity: the search stops when the gap is at most 1/`fine` of the held rung.
    fine: usize,
    /// Capacity: a stream is held if no slot came later than this past its schedule
    /// (a player that buffers this much before it starts playing never stalls).
    buffer: Duration,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                rate: 2_000_000,
                per_node: 4,
                chunk: 64 << 10,
                window: 6_000_000,
                clips: 3,
                clip_len: 20 << 20,
                rounds: 1,
                failover_rounds: 2,
                failover_streams: 4,
                failover_window: 16_000_000,
                after_kill: Duration::from_secs(2),
                cache: 64 << 20,
                ahead: 4 << 20,
                // Per node at 4 nodes: nginx held 32 per node with light players.
                top: 64,
                fine: 4,
                buffer: Duration::from_secs(1),
            }
        } else {
            Plan {
                rate: 3_000_000,
                per_node: 6,
                chunk: 64 << 10,
                window: 36_000_000,
                clips: 4,
                clip_len: 48 << 20,
                rounds: 3,
                failover_rounds: 10,
                failover_streams: 4,
                failover_window: 40_000_000,
                after_kill: Duration::from_secs(3),
                cache: 128 << 20,
                ahead: 6 << 20,
                top: 48,
                fine: 8,
                buffer: Duration::from_secs(1),
            }
        }
    }

    /// A node's capacity: its streams, with the engine's real-time reserve (80 %) and
    /// a margin.
    fn capacity(&self) -> u64 {
        self.capacity_for(self.per_node)
    }

    /// A node's capacity for `streams` streams.
    fn capacity_for(&self, streams: usize) -> u64 {
        (streams as f64 * self.rate as f64 / 0.8 * 1.1) as u64
    }

    /// The plan's streams a node told `capacity` admits (its engine's real-time share).
    fn streams_admitted(&self, capacity: u64) -> usize {
        (capacity as f64 * crate::EngineConfig::default().rt_reserve / self.rate.max(1) as f64).ceil() as usize
    }
}

/// Deterministic clip bytes.
fn clip_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = vec![0u8; len];
    for w in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        w.copy_from_slice(&b[..w.len()]);
    }
    v
}

struct CatalogOf(Striper);

impl Catalog for CatalogOf {
    fn len(&self, name: &str) -> Option<u64> {
        self.0.stat(name).ok()
    }
}

/// A directory removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Everything a phase needs.
struct Bed<'a> {
    plan: Plan,
    clips: &'a [(String, Vec<u8>)],
    striper: Striper,
    conf: PathBuf,
    pool: String,
    dir: PathBuf,
    /// nginx nodes' addresses (ids 1..=4).
    nginx: Vec<SocketAddr>,
    /// Node `i`'s network namespace (index `i - 1`), ours and nginx's, if they have
    /// their own.
    places: Vec<Place>,
    /// Where the director listens (the bridge's address with namespaces).
    host: std::net::Ipv4Addr,
    /// The Ceph OSD's process id (its CPU per rung), if recorded.
    osd: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Ours,
    Nginx,
}

impl Who {
    fn name(self) -> &'static str {
        match self {
            Who::Ours => "ictus mars nodes over Ceph + director",
            Who::Nginx => "nginx nodes (own copies) + nginx round-robin front",
        }
    }
}

fn run(opts: &Options) -> Result<Outcome, BenchError> {
    let signals = rig::StopOnSignals::register();
    let conditions = Conditions::capture_before();
    let mut notes = Notes::new();
    let mut rows = Vec::new();
    let mut headline = Vec::new();
    let mut plots = Vec::new();
    let result = measure(opts, &mut notes, &mut rows, &mut headline, &mut plots);
    drop(signals);
    result?;
    let mut report = Report::new(MARS_CLUSTER.name, PAPER, opts.quick, conditions.finish());
    report.rows = rows;
    report.headline = headline;
    report.add_notes(notes);
    Ok(plots.into_iter().fold(Outcome { report, plots: Vec::new() }, |o, (suffix, svg)| o.with_plot(suffix, svg)))
}

fn measure(
    opts: &Options,
    notes: &mut Notes,
    rows: &mut Vec<Value>,
    headline: &mut Vec<Headline>,
    plots: &mut Vec<(&'static str, String)>,
) -> Result<(), BenchError> {
    let plan = Plan::new(opts.quick);
    if let Some(why) = ictus_objstore::testcluster::unavailable() {
        notes.not_measured("everything (no Ceph cluster)", format!("Ceph cannot run here: {why}"));
        return Ok(());
    }
    let have_nginx = rig::have("nginx", "-v");
    if !have_nginx {
        notes.not_measured("nginx rows", "nginx is not installed (scripts/setup.sh installs nginx-light)");
    }
    crate::cli::raise_nofile();
    let base = std::env::var_os("ICTUS_MARS_BENCH_DIR").map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
    let base = if base.is_dir() { base } else { std::env::temp_dir() };
    rig::sweep_stale(&base);
    netns::sweep_stale();
    // Namespaces first: the Ceph daemons listen on the bridge's address.
    let mut net = match netns::Net::make() {
        Ok(n) => Some(n),
        Err(why) => {
            notes.not_measured(
                "nodes in network namespaces",
                format!("{why}: every node runs in the host's namespace, on the loopback"),
            );
            None
        }
    };
    let mut places = Vec::new();
    if let Some(n) = net.as_mut() {
        for id in 1..=4 {
            match n.node(id) {
                Ok(p) => places.push(p),
                Err(why) => {
                    notes.not_measured("nodes in network namespaces", format!("{why}: nodes on the loopback"));
                    places.clear();
                    net = None;
                    break;
                }
            }
        }
    }
    let host = net.as_ref().map_or(std::net::Ipv4Addr::LOCALHOST, |n| n.host);
    if let Some(n) = net.as_mut() {
        notes.push(format!(
            "network: each node (ours, and nginx's) in its own network namespace, a veth pair to a bridge at {host} in the host's namespace, where the Ceph daemons, the director and nginx's front listen and the players run"
        ));
        match n.shape(Some(LINK_BITS)) {
            Ok(()) => notes.push(format!(
                "links: each node's veth (ours and nginx's alike) shaped to {} Mbit/s each way, its NIC (tc tbf as the root qdisc of both ends: {}); so one node's capacity is its link, as on separate machines, and 4 × the link is well within what this machine delivers unshaped (the capacity's unshaped check). Separate CPUs and disks are not simulated: every node, the OSD and the players share this machine's cores",
                LINK_BITS / 1_000_000,
                netns::tbf_args(LINK_BITS).join(" ")
            )),
            Err(why) => notes.not_measured(
                "per-node links",
                format!("{why}: the nodes' veths are unshaped (as fast as memory), so one node can use the whole machine and mars_cluster_scaling_4n measures how two cores split among 4 nodes, not the design"),
            ),
        }
    }
    let scratch = Scratch(base.join(format!("{}{}-cluster", rig::PREFIX, std::process::id())));
    std::fs::create_dir_all(&scratch.0).map_err(|e| err("scratch directory", e))?;

    opts.say("mars-cluster: starting a Ceph cluster (scripts/ceph.sh, 1 OSD, BlueStore)");
    let t = Instant::now();
    let cluster = TestCluster::start_at(1, std::process::id(), net.as_ref().map(|n| n.host))
        .map_err(|e| err("starting the Ceph cluster", e))?;
    notes.push(format!(
        "Ceph 1 monitor, 1 manager, 1 BlueStore OSD on a sparse file (scripts/ceph.sh): up in {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    // Dropped (stopped) before the cluster.
    let mut procs = Procs::default();
    let result = (|| -> Result<(), BenchError> {
        let striper = Rados::connect(cluster.conf(), 10)
            .and_then(|r| r.striper(cluster.pool(), Layout::default()))
            .map_err(|e| err("connecting to the cluster", e))?;
        opts.say("mars-cluster: uploading the clips");
        let clips: Vec<(String, Vec<u8>)> =
            (0..plan.clips).map(|i| (format!("films/c{i}.bin"), clip_bytes(plan.clip_len, 1 + i as u64))).collect();
        let t = Instant::now();
        for (name, data) in &clips {
            striper.put(name, &mut &data[..], data.len() as u64).map_err(|e| err("uploading a clip", e))?;
        }
        notes.push(format!(
            "{} clips of {} MiB uploaded through libradosstriper at {:.0} MB/s",
            plan.clips,
            plan.clip_len >> 20,
            (plan.clips * plan.clip_len) as f64 / t.elapsed().as_secs_f64() / 1e6
        ));
        let mut bed = Bed {
            plan,
            clips: &clips,
            striper,
            conf: cluster.conf().to_path_buf(),
            pool: cluster.pool().to_string(),
            dir: scratch.0.clone(),
            nginx: Vec::new(),
            places,
            host,
            osd: std::fs::read_to_string(cluster.dir().join("run/osd.0.pid")).ok().map(|p| p.trim().to_string()),
        };
        if have_nginx {
            start_nginx_nodes(&mut bed, &mut procs)?;
        }
        let whos: &[Who] = if have_nginx { &[Who::Ours, Who::Nginx] } else { &[Who::Ours] };
        let r = scaling(opts, &bed, &mut procs, whos, notes, rows, plots)
            .and_then(|()| capacity(opts, &bed, &mut procs, whos, notes, rows, headline, plots, &mut net))
            .and_then(|()| failover(opts, &bed, &mut procs, whos, notes, rows, headline, plots));
        let said = node_warnings(&bed);
        if !said.is_empty() {
            notes.push(format!("our nodes said (each a process; once each): {}", said.join(" | ")));
        }
        r
    })();
    drop(procs);
    let down = cluster.stop();
    drop(net);
    let left = netns::leftovers();
    if !left.is_empty() {
        return Err(err("tearing down", format!("left behind: {}", left.join("; "))));
    }
    result?;
    down.map_err(|e| err("stopping the Ceph cluster", e))?;
    notes.push(format!(
        "each of our nodes: its own process (this binary), engine timesharing like nginx, stripe cache {} MiB of 1 MiB chunks, {} MiB read ahead per stream, capacity {:.1} MB/s told to the director (in the capacity ramp: above its top rung); nginx 1.22: one process per node (master_process off), sendfile on, files in the page cache; front: {} worker(s) (one per CPU, as worker_processes auto), proxy_pass to an upstream of the nodes (round robin, proxy_next_upstream's default: error and timeout go to the next node), proxy_buffering off, proxy_buffer_size 64k, keepalive to the nodes",
        plan.cache >> 20,
        plan.ahead >> 20,
        plan.capacity() as f64 / 1e6,
        front_workers()
    ));
    Ok(())
}

/// Four nginx nodes, each with its own copy of the clips.
fn start_nginx_nodes(bed: &mut Bed<'_>, procs: &mut Procs) -> Result<(), BenchError> {
    for id in 1..=4u32 {
        let root = bed.dir.join(format!("nginx{id}"));
        std::fs::create_dir_all(root.join("films")).map_err(|e| err("nginx copy", e))?;
        for (name, data) in bed.clips {
            std::fs::write(root.join(name), data).map_err(|e| err("nginx copy", e))?;
        }
        std::fs::write(root.join("probe.txt"), b"ok").map_err(|e| err("nginx copy", e))?;
        let port = rig::free_port()?;
        let ip = bed.places.get(id as usize - 1).map_or(std::net::Ipv4Addr::LOCALHOST, |p| p.1);
        bed.nginx.push(SocketAddr::from((ip, port)));
        start_nginx_node(bed, procs, id)?;
    }
    Ok(())
}

fn start_nginx_node(bed: &Bed<'_>, procs: &mut Procs, id: u32) -> Result<(), BenchError> {
    let addr = bed.nginx[id as usize - 1];
    let root = bed.dir.join(format!("nginx{id}"));
    let name = format!("nginx{id}");
    let conf = procs::nginx_conf(
        &bed.dir,
        &name,
        &format!("server {{ listen {addr} reuseport; root {}; add_header X-Node {id} always; }}", root.display()),
    )?;
    procs.nginx(&name, &bed.dir, &conf, bed.places.get(id as usize - 1).map(|p| p.0.as_str()))?;
    procs::wait_nginx(&bed.dir, &name, addr, "probe.txt", Some(id))
}

/// Starts nginx's front over nginx nodes `1..=n`, one worker per CPU (what
/// `worker_processes auto` gives; here separate single-process servers on one
/// `reuseport` port, so that each is a child this run tracks and stops); its address.
fn start_front(bed: &Bed<'_>, procs: &mut Procs, n: usize) -> Result<SocketAddr, BenchError> {
    let port = rig::free_port()?;
    let servers: String = bed.nginx[..n].iter().map(|a| format!("server {a}; ")).collect();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    for w in 0..front_workers() {
        let name = format!("front{w}");
        let conf = procs::nginx_conf(
            &bed.dir,
            &name,
            &format!(
                "upstream nodes {{ {servers}keepalive 64; }}\n  server {{ listen 127.0.0.1:{port} reuseport; location / {{ proxy_pass http://nodes; \
                 proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; proxy_buffer_size 64k; proxy_buffers 4 64k; }} }}"
            ),
        )?;
        procs.nginx_as("front", &name, &bed.dir, &conf, None)?;
        procs::wait_nginx(&bed.dir, &name, addr, "probe.txt", None)?;
    }
    Ok(addr)
}

/// The front's workers: one per CPU, as `worker_processes auto`.
fn front_workers() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// A director in this process, its nodes `1..=n` as processes; returns once all
/// registered.
fn start_ours(bed: &Bed<'_>, procs: &mut Procs, n: u32) -> Result<RunningDirector, BenchError> {
    start_ours_with(bed, procs, n, bed.plan.capacity())
}

/// [`start_ours`] with each node's capacity (bytes/s) given.
fn start_ours_with(bed: &Bed<'_>, procs: &mut Procs, n: u32, capacity: u64) -> Result<RunningDirector, BenchError> {
    let bind = || crate::listen_tcp((bed.host, 0)).map_err(|e| err("director", e));
    let key = procs::cluster_key(&bed.dir)?;
    let d = RunningDirector::start(
        bind()?,
        bind()?,
        Box::new(CatalogOf(bed.striper.clone())),
        DirectorOptions {
            config: ictus_mars_cluster::Config {
                heartbeat_timeout_ns: 2_000_000_000,
                store_capacity: 1 << 40,
                // What `ictus mars director` uses (doc/mars-cluster.md: the bound measured).
                cache_bound_pct: Some(ictus_mars_cluster::CACHE_BOUND_PCT),
            },
            default_rate: bed.plan.rate,
            tick: Duration::from_millis(50),
            close_grace: Duration::from_secs(1),
            key,
        },
    )
    .map_err(|e| err("starting the director", e))?;
    for id in 1..=n {
        let spec = NodeSpec {
            capacity,
            buffers: procs::buffers_for(bed.plan.streams_admitted(capacity), bed.plan.rate),
            ..spec(bed, d.nodes)
        };
        procs.node(&spec, id, bed.places.get(id as usize - 1), &node_log(bed, id))?;
    }
    wait_nodes(bed, &d, procs, n as usize)?;
    Ok(d)
}

/// Where node `id`'s standard error goes.
fn node_log(bed: &Bed<'_>, id: u32) -> PathBuf {
    bed.dir.join(format!("node{id}.err"))
}

/// The distinct lines the nodes wrote to standard error (their warnings: what was not
/// granted), for one note.
fn node_warnings(bed: &Bed<'_>) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for id in 1..=4 {
        let text = std::fs::read_to_string(node_log(bed, id)).unwrap_or_default();
        for l in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if !lines.iter().any(|x| x == l) {
                lines.push(l.to_string());
            }
        }
    }
    lines
}

fn spec(bed: &Bed<'_>, director: SocketAddr) -> NodeSpec {
    NodeSpec {
        conf: bed.conf.clone(),
        pool: bed.pool.clone(),
        director,
        capacity: bed.plan.capacity(),
        cache: bed.plan.cache,
        ahead: bed.plan.ahead,
        buffers: procs::buffers_for(bed.plan.streams_admitted(bed.plan.capacity()), bed.plan.rate),
        key: procs::key_file(&bed.dir),
    }
}

fn wait_nodes(bed: &Bed<'_>, d: &RunningDirector, procs: &mut Procs, n: usize) -> Result<(), BenchError> {
    let end = Instant::now() + Duration::from_secs(90);
    while d.snapshot().nodes.len() < n {
        for id in 1..=n {
            if let Some(st) = procs.exited(&format!("node {id}")) {
                let log = std::fs::read_to_string(node_log(bed, id as u32)).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                return Err(err(
                    "a stream node",
                    format!("node {id} exited ({st}) before registering: {}", tail.join(" / ")),
                ));
            }
        }
        if Instant::now() > end {
            return Err(err("stream nodes", format!("{} of {n} registered within 90 s", d.snapshot().nodes.len())));
        }
        nap(Duration::from_millis(20))?;
    }
    Ok(())
}

/// The `i`-th stream of a phase: its clip and where in it.
fn pick(bed: &Bed<'_>, i: usize, seed: u64, window: u64) -> (usize, u64) {
    let c = i % bed.clips.len();
    let room = bed.clips[c].1.len() as u64 - window - (1 << 20);
    let mut x = seed.wrapping_mul(0x2545_f491_4f6c_dd1d).wrapping_add(i as u64 * 0x9e37_79b9) | 1;
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 32;
    (c, (x % room) & !0xfff)
}

/// Plays `n` streams through `via` at once (started at most 20 ms and 0.5 s in all apart); the main thread
/// runs `during` meanwhile (a failover's kill).
fn play_all(
    bed: &Bed<'_>,
    via: Via,
    n: usize,
    seed: u64,
    failover: bool,
    resume: Option<&KillClock>,
    during: impl FnOnce(&[Mutex<Option<u32>>]) -> Result<(), BenchError>,
) -> Result<Vec<Played>, BenchError> {
    let plan = bed.plan;
    let window = if failover { plan.failover_window } else { plan.window };
    let nodes: Vec<Mutex<Option<u32>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let limit = Duration::from_secs_f64(window as f64 / plan.rate as f64 * 3.0 + 20.0);
    // Starts at most 20 ms and 0.5 s in all apart: many short streams must overlap.
    let gap = Duration::from_millis(20).min(Duration::from_millis(500) / n.max(1) as u32);
    let (pump, pump_loop) = play::pump().map_err(|e| err("players", format!("the players' epoll: {e}")))?;
    std::thread::scope(|s| {
        let pumping = s.spawn(move || pump_loop.run());
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (c, offset) = pick(bed, i, seed, window);
                let (name, data) = &bed.clips[c];
                let node = &nodes[i];
                let pump = pump.clone();
                std::thread::sleep(gap);
                s.spawn(move || {
                    let st = Stream {
                        via,
                        clip: name,
                        expect: &data[offset as usize..],
                        offset,
                        rate: plan.rate,
                        chunk: plan.chunk,
                        window,
                        limit,
                        after_kill: failover.then_some(plan.after_kill),
                    };
                    play::play(&st, resume, node, &pump)
                })
            })
            .collect();
        // The pump's loop ends once the players' handles are gone.
        drop(pump);
        let during = during(&nodes);
        let played: Vec<Played> = handles.into_iter().filter_map(|h| h.join().ok()).collect();
        if pumping.join().is_err() {
            return Err(err("players", "the players' pump panicked"));
        }
        during?;
        check_stop()?;
        if played.len() < n {
            return Err(err("players", "a player thread panicked"));
        }
        Ok(played)
    })
}

/// What a set of streams added up to.
#[derive(Debug, Default, Clone)]
struct Tally {
    aggregate: f64,
    held: usize,
    streams: usize,
    late: u64,
    slots: u64,
    wrong: usize,
    errors: Vec<String>,
}

/// Sums up streams; a failover round's streams are judged over what they played (they
/// stop a while after the kill).
fn tally(bed: &Bed<'_>, played: &[Played], failover: bool) -> Tally {
    let mut t = Tally { streams: played.len(), ..Tally::default() };
    for p in played {
        let window = if failover { p.received.bytes.max(1) } else { bed.plan.window };
        let j = judge(&p.received, bed.plan.rate as f64, bed.plan.chunk, window);
        t.aggregate +=
            j.achieved.min(2.0 * bed.plan.rate as f64) * (p.received.bytes.min(window) as f64) / window as f64;
        t.held += usize::from(j.held && !p.wrong);
        t.late += j.late;
        t.slots += j.slots;
        t.wrong += usize::from(p.wrong);
        if let Some(e) = &p.error {
            t.errors.push(e.clone());
        }
    }
    t
}

#[allow(clippy::too_many_arguments)]
fn scaling(
    opts: &Options,
    bed: &Bed<'_>,
    procs: &mut Procs,
    whos: &[Who],
    notes: &mut Notes,
    rows: &mut Vec<Value>,
    plots: &mut Vec<(&'static str, String)>,
) -> Result<(), BenchError> {
    let counts = [1usize, 2, 4];
    // (who, nodes) → aggregate per round
    let mut runs: Vec<((Who, usize), Vec<Tally>)> = Vec::new();
    let mut redirect = LatencyRecorder::new();
    let mut first_byte: Vec<(Who, LatencyRecorder)> = whos.iter().map(|&w| (w, LatencyRecorder::new())).collect();
    let mut placements = (0u64, 0u64);
    for round in 0..bed.plan.rounds {
        for k in 0..counts.len() {
            let n = counts[(k + round) % counts.len()];
            for (w, &who) in whos.iter().enumerate() {
                let who = if round % 2 == 1 { whos[(w + 1) % whos.len()] } else { who };
                check_stop()?;
                opts.say(format!("mars-cluster: {n} node(s), {}, round {}", who.name(), round + 1));
                let streams = n * bed.plan.per_node;
                let seed = (round * 10 + n) as u64;
                let played = match who {
                    Who::Ours => {
                        let d = start_ours(bed, procs, n as u32)?;
                        let r = play_all(bed, Via::Director(d.http), streams, seed, false, None, |_| Ok(()));
                        let snap = d.snapshot();
                        placements.0 += snap.placements.0;
                        placements.1 += snap.placements.1;
                        for id in 1..=n {
                            procs.stop(&format!("node {id}"));
                        }
                        d.stop();
                        r?
                    }
                    Who::Nginx => {
                        let front = start_front(bed, procs, n)?;
                        let r = play_all(bed, Via::Front(front), streams, seed, false, None, |_| Ok(()));
                        procs.stop("front");
                        r?
                    }
                };
                for p in &played {
                    redirect.record_all(&p.redirect_ns);
                    if let (Some(first), Some(e)) =
                        (p.received.first_byte_ns(), first_byte.iter_mut().find(|e| e.0 == who))
                    {
                        e.1.record(first);
                    }
                }
                let t = tally(bed, &played, false);
                if !t.errors.is_empty() {
                    notes.push(format!(
                        "{} with {n} node(s), round {}: {} of {} streams stopped early, first: {}",
                        who.name(),
                        round + 1,
                        t.errors.len(),
                        streams,
                        t.errors[0]
                    ));
                }
                match runs.iter_mut().find(|(k, _)| *k == (who, n)) {
                    Some((_, v)) => v.push(t),
                    None => runs.push(((who, n), vec![t])),
                }
            }
        }
    }
    let med = |who: Who, n: usize| -> Option<f64> {
        let v = &runs.iter().find(|(k, _)| *k == (who, n))?.1;
        ictus_bench::stats::median(v.iter().map(|t| t.aggregate))
    };
    for &who in whos {
        for n in counts {
            let Some((_, v)) = runs.iter().find(|(k, _)| *k == (who, n)) else { continue };
            let agg: Vec<f64> = v.iter().map(|t| t.aggregate / 1e6).collect();
            let sum = |f: fn(&Tally) -> u64| v.iter().map(f).sum::<u64>();
            rows.push(json!({
                "case": format!("{n} node(s): {}", who.name()),
                "part": "scaling", "implementation": who.name(), "nodes": n,
                "aggregate_mb_s": med(who, n).unwrap_or(f64::NAN) / 1e6,
                "min_mb_s": agg.iter().copied().fold(f64::INFINITY, f64::min),
                "max_mb_s": agg.iter().copied().fold(0.0, f64::max),
                "offered_mb_s": (n * bed.plan.per_node) as f64 * bed.plan.rate as f64 / 1e6,
                "streams": sum(|t| t.streams as u64), "held": sum(|t| t.held as u64),
                "late_slots": sum(|t| t.late), "slots": sum(|t| t.slots), "wrong_bytes_streams": sum(|t| t.wrong as u64),
                "rounds": v.len(),
            }));
        }
    }
    for (who, r) in &first_byte {
        if r.count() > 0 {
            rows.push(
                r.row(format!("start: request → first byte ({})", who.name()))
                    .with("part", "scaling")
                    .with("implementation", who.name())
                    .to_value(),
            );
        }
    }
    if redirect.count() > 0 {
        rows.push(
            redirect
                .row("director: ask → 302 (as the player sees it)")
                .with("part", "placement")
                .with("placements", placements.0)
                .with("core_ns_per_placement", placements.1 as f64 / placements.0.max(1) as f64)
                .to_value(),
        );
    }
    notes.push(format!(
        "scaling: each node offered {} players at {:.1} MB/s ({:.1} s each, from pseudo-random places in {} clips), started 20 ms apart; a player reads at most {} KiB ahead of its playback clock; aggregate = Σ over streams of bytes/s from its first byte (a stream cut short counts its share); {} round(s), node counts rotated, ours and nginx alternating",
        bed.plan.per_node,
        bed.plan.rate as f64 / 1e6,
        bed.plan.window as f64 / bed.plan.rate as f64,
        bed.plan.clips,
        bed.plan.chunk >> 10,
        bed.plan.rounds
    ));
    let series = whos
        .iter()
        .map(|&who| Series {
            name: match who {
                Who::Ours => "ours: nodes over Ceph".to_string(),
                Who::Nginx => "nginx: own copies".to_string(),
            },
            points: counts.iter().filter_map(|&n| Some((n as f64, med(who, n)? / 1e6))).collect(),
        })
        .chain(med(Who::Ours, 1).map(|one| Series {
            name: "ours: n × 1 node".into(),
            points: counts.iter().map(|&n| (n as f64, n as f64 * one / 1e6)).collect(),
        }))
        .collect();
    plots.push((
        "",
        Plot {
            title: "Aggregate stream throughput by nodes (one Ceph cluster)".into(),
            x: Axis { label: "stream nodes".into(), scale: Scale::Linear, ticks: TickFormat::Plain },
            y: Axis { label: "MB/s received by the players".into(), scale: Scale::Linear, ticks: TickFormat::Plain },
            series,
        }
        .render(),
    ));
    Ok(())
}

/// One rung of the capacity ramp, as its players saw it.
#[derive(Debug, Clone, Copy, Default)]
struct Rung {
    streams: usize,
    /// Streams with every byte, right, no slot later than the player's buffer.
    held: usize,
    /// Streams refused (a non-2xx answer: admission).
    refused: usize,
    /// Σ bytes/s received.
    aggregate: f64,
    /// The worst slot lateness of any stream (ns).
    worst: u64,
}

/// The capacity ramp's search for one side, in streams per node: doubling from 1 until
/// a rung is not held, then halving the gap between the most held and the fewest failed
/// until it is at most `1 / fine` of the held rung (and at least 1). A failed rung is run
/// once more and the better of the two counts (one bad second on a shared machine does
/// not end a side's ramp); a rung held once is held. The same search for every side, so
/// no side's result comes from its rungs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Search {
    /// The most streams per node tried.
    top: usize,
    /// Resolution: stop when the gap is at most `held / fine`.
    fine: usize,
    /// The most streams per node held (every stream), 0 if none.
    held: usize,
    /// The fewest streams per node not held in two tries.
    failed: Option<usize>,
    /// A rung not held once, to be run again.
    retry: Option<usize>,
}

impl Search {
    fn new(top: usize, fine: usize) -> Search {
        Search { top: top.max(1), fine: fine.max(1), held: 0, failed: None, retry: None }
    }

    /// The next rung (streams per node), or `None` when the search is done.
    fn next(&self) -> Option<usize> {
        if let Some(r) = self.retry {
            return Some(r);
        }
        match self.failed {
            None if self.held >= self.top => None,
            None => Some(if self.held == 0 { 1 } else { (self.held * 2).min(self.top) }),
            Some(f) => {
                let gap = (self.held / self.fine).max(1);
                (f > self.held + gap).then_some((self.held + f) / 2)
            }
        }
    }

    /// What rung `per_node` gave.
    fn record(&mut self, per_node: usize, held_all: bool) {
        if held_all {
            self.retry = None;
            self.held = self.held.max(per_node);
        } else if self.retry == Some(per_node) {
            self.retry = None;
            self.failed = Some(self.failed.map_or(per_node, |f| f.min(per_node)));
        } else {
            self.retry = Some(per_node);
        }
    }

    /// Every rung up to the top was held: the capacity is at least the top.
    fn ceiling(&self) -> bool {
        self.failed.is_none() && self.held >= self.top
    }
}

/// One side of the ramp: who, on how many nodes, its search and the rungs it ran.
struct Side {
    who: Who,
    nodes: usize,
    search: Search,
    rungs: Vec<Rung>,
}

impl Side {
    /// Capacity (bytes/s offered at the most streams held entirely).
    fn capacity(&self, rate: u64) -> f64 {
        (self.search.held * self.nodes) as f64 * rate as f64
    }

    fn label(&self) -> String {
        format!("{}, {} node(s)", self.who.name(), self.nodes)
    }
}

/// Capacity, measured: the paced streams offered rise rung by rung ([`Search`]) until a
/// side no longer holds every stream — a stream is held if it got the whole window,
/// every byte right, and no 64 KiB slot later than the player's startup buffer past its
/// schedule. A side's capacity is the offered aggregate of the most streams it held
/// entirely. Sides: ours at 1 node, searched first; then ours and nginx at 4 nodes
/// (`mars_cluster_vs_nginx` = ours / nginx's; `mars_cluster_scaling_4n` = ours at 4
/// nodes / 4 × ours at 1 node) with a top per node of twice the 1-node capacity, so that
/// a 4-node side at its top is exceptional; at each step both 4-node sides run their
/// next rung, the order rotating by step, so a change of the machine's load falls on
/// both. Then, with the links shaped, one rung of ours at 4 nodes unshaped: what the
/// machine gives without them. Our nodes are told a capacity
/// above the top rung, so the director's admission refuses nothing here: delivery is
/// what is measured.
#[allow(clippy::too_many_arguments)]
fn capacity(
    opts: &Options,
    bed: &Bed<'_>,
    procs: &mut Procs,
    whos: &[Who],
    notes: &mut Notes,
    rows: &mut Vec<Value>,
    headline: &mut Vec<Headline>,
    plots: &mut Vec<(&'static str, String)>,
    net: &mut Option<netns::Net>,
) -> Result<(), BenchError> {
    let plan = bed.plan;
    let link = net.as_ref().and_then(|n| n.rate());
    // The 1-node side first: its capacity sets the 4-node sides' top, so that a 4-node
    // side at its top is exceptional (it held more than 4 × one node's streams).
    let mut sides =
        vec![Side { who: Who::Ours, nodes: 1, search: Search::new(4 * plan.top, plan.fine), rungs: Vec::new() }];
    let mut step = 0usize;
    while let Some(per_node) = sides[0].search.next() {
        run_side_rung(opts, bed, procs, &mut sides[0], per_node, step, link, rows)?;
        step += 1;
    }
    // The 4-node sides' top per node: the doubling's rung above one node's capacity
    // (4 nodes at it offer twice 4 × one node's), and at least the search's first
    // failed rung; one node that held its top (or nothing) gives the plan's.
    let one = &sides[0].search;
    let top4 = if one.ceiling() || one.held == 0 { plan.top } else { (2 * one.held).max(one.failed.unwrap_or(0)) };
    sides.extend(whos.iter().map(|&who| Side {
        who,
        nodes: 4,
        search: Search::new(top4, plan.fine),
        rungs: Vec::new(),
    }));
    while sides[1..].iter().any(|s| s.search.next().is_some()) {
        let k = sides.len() - 1;
        for j in 0..k {
            let i = 1 + (j + step) % k;
            let Some(per_node) = sides[i].search.next() else { continue };
            run_side_rung(opts, bed, procs, &mut sides[i], per_node, step, link, rows)?;
        }
        step += 1;
    }
    // What the machine gives without the links: ours at 4 nodes, unshaped, at the
    // 4-node side's first failed rung (or its top). Held, the links were the bound and
    // not the machine's cores.
    if let Some(n) = net.as_mut().filter(|n| n.rate().is_some()) {
        let four = &sides[1].search;
        let per_node = four.failed.unwrap_or(four.top).max(1);
        let rate = n.rate();
        n.shape(None).map_err(|e| err("unshaping the links", e))?;
        let mut check = Side { who: Who::Ours, nodes: 4, search: Search::new(per_node, 1), rungs: Vec::new() };
        let r = run_side_rung(opts, bed, procs, &mut check, per_node, step, None, rows);
        n.shape(rate).map_err(|e| err("shaping the links", e))?;
        let r = r?;
        notes.push(format!(
            "capacity, unshaped check (what the machine gives): ours at 4 nodes without the links' bound held {} of {} streams ({:.0} MB/s offered) where the shaped 4 nodes {} it; {}",
            r.held,
            r.streams,
            (r.streams as u64 * plan.rate) as f64 / 1e6,
            if four.failed.is_some() { "failed" } else { "held (their top)" },
            if r.held == r.streams {
                "the links, not the machine's cores, bound the shaped sides"
            } else {
                "the machine itself is near its limit there, so the links are not the only bound"
            }
        ));
    }
    for s in &sides {
        rows.push(json!({
            "case": format!("capacity: {}", s.label()),
            "part": "capacity", "implementation": s.who.name(), "nodes": s.nodes,
            "capacity_streams": s.search.held * s.nodes,
            "capacity_mb_s": s.capacity(plan.rate) / 1e6,
            "first_failed_streams": s.search.failed.map(|f| f * s.nodes),
            "at_least": s.search.ceiling(),
            "rungs_run": s.rungs.len(),
        }));
        if s.search.ceiling() {
            notes.push(format!(
                "capacity: {} held every rung up to its top, {:.0} MB/s: its capacity is at least that",
                s.label(),
                s.capacity(plan.rate) / 1e6
            ));
        }
    }
    let side = |who: Who, nodes: usize| sides.iter().find(|s| s.who == who && s.nodes == nodes);
    if let (Some(ours), Some(nginx)) = (side(Who::Ours, 4), side(Who::Nginx, 4)) {
        let (o, n) = (ours.capacity(plan.rate), nginx.capacity(plan.rate));
        if nginx.search.ceiling() {
            // The peer held every rung: its capacity is only "at least", and a ratio
            // over it would be met by the top's choice, not measured.
            notes.not_measured(
                "mars_cluster_vs_nginx",
                format!(
                    "nginx held every rung up to the top ({:.0} MB/s; ours {}{:.0} MB/s): the peer's capacity is above what the search tries, so the ratio is not measured",
                    n / 1e6,
                    if ours.search.ceiling() { "at least " } else { "" },
                    o / 1e6
                ),
            );
        } else if n > 0.0 {
            headline.push(
                Headline::new(
                    "mars_cluster_vs_nginx",
                    o / 1e6,
                    n / 1e6,
                    "capacity at 4 nodes: the most paced streams every one of which was held, beside 4 nginx 1.22 nodes with their own copies behind an nginx round-robin front",
                    "MB/s",
                    Better::Higher,
                )
                .with_target(1.0),
            );
        } else {
            notes.not_measured(
                "mars_cluster_vs_nginx",
                format!(
                    "nginx held no rung, not even 1 stream per node in two tries (ours held {:.0} MB/s): the ratio has no denominator; the rows say what each held",
                    o / 1e6
                ),
            );
        }
    }
    if let (Some(four), Some(one)) = (side(Who::Ours, 4), side(Who::Ours, 1)) {
        let (f, o) = (four.capacity(plan.rate), one.capacity(plan.rate));
        let scaling_text = match link {
            Some(r) => format!(
                "4 × the capacity of 1 node (the most paced streams every one of which was held), same run, each node on its own {} Mbit/s link (tc tbf on its veth, ours and nginx's alike: one node's capacity is its link, as on separate machines with their NICs); what scaling adds or loses here is the design's: placement's evenness (the rows' streams_per_node), the director, each node filling its cache from the one Ceph cluster; not simulated: separate CPUs and disks (the nodes, the OSD and the players share this machine's cores)",
                r / 1_000_000
            ),
            None => "4 × the capacity of 1 node (the most paced streams every one of which was held), same run, links unshaped (no CAP_NET_ADMIN or no tc: nodes as fast as memory); the 4 nodes, the one OSD and the players share this machine's cores (the rows' machine_busy_cores), so this says how one machine's CPU splits among 4 nodes, not what 4 machines would carry; with fewer clips than nodes the unbounded cache-first placement leaves a node idle (the rows' streams_per_node)".to_string(),
        };
        if one.search.ceiling() {
            // 1 node held every rung: the denominator is only "at least", so the ratio
            // is at most what it shows (it would be met by the top's choice, or, with
            // both at their tops, compare two lower bounds).
            notes.not_measured(
                "mars_cluster_scaling_4n",
                format!(
                    "1 node held every rung up to its top ({:.0} MB/s; 4 nodes {}{:.0} MB/s): its capacity is above what the search tries, so the ratio is not measured",
                    o / 1e6,
                    if four.search.ceiling() { "at least " } else { "" },
                    f / 1e6
                ),
            );
        } else if o > 0.0 {
            headline.push(
                Headline::new("mars_cluster_scaling_4n", f / 1e6, 4.0 * o / 1e6, &scaling_text, "MB/s", Better::Higher)
                    .with_target(0.9),
            );
        } else {
            notes.not_measured(
                "mars_cluster_scaling_4n",
                "1 node held no rung, not even 1 stream in two tries: the ratio has no denominator",
            );
        }
    }
    notes.push(format!(
        "capacity: ours and nginx at 4 nodes, ours at 1 node; paced streams at {:.1} MB/s ({:.1} s each), started at most 20 ms and at most 0.5 s in all apart; streams per node double from 1 until a rung is not held (a rung not held is run once more, the better counts), then the gap to the first failed rung is halved down to 1/{} of the held one; at each step every side runs its next rung, the order rotating; fresh nodes (and front) each rung; a stream is held if it got its whole window, every byte right, and no {} KiB slot later than {:.1} s (a player's startup buffer) past its schedule from its first byte; capacity = the offered aggregate of the most streams held entirely; our nodes are told a capacity above the top rung (the director refuses nothing: delivery is measured, not admission); the 1-node side is searched first, then the 4-node sides (ours and nginx's, interleaved) with a top per node of twice the 1-node capacity (so a 4-node side at its top held more than 4 × one node: exceptional, and its headline is then not measured); every node, Ceph, nginx and the players share this machine's cores: with the links shaped one node's capacity is its link, unshaped 4 nodes cannot have 4 machines' capacity here",
        plan.rate as f64 / 1e6,
        plan.window as f64 / plan.rate as f64,
        plan.fine,
        plan.chunk >> 10,
        plan.buffer.as_secs_f64()
    ));
    let series = sides
        .iter()
        .map(|s| Series {
            name: match (s.who, s.nodes) {
                (Who::Ours, 4) => "ours, 4 nodes: streams held".to_string(),
                (Who::Ours, _) => "ours, 1 node: streams held".to_string(),
                (Who::Nginx, _) => "nginx, 4 nodes: streams held".to_string(),
            },
            points: {
                let mut v: Vec<(f64, f64)> = s.rungs.iter().map(|g| (g.streams as f64, g.held as f64)).collect();
                v.sort_by(|a, b| a.0.total_cmp(&b.0));
                v
            },
        })
        .collect();
    plots.push((
        "-capacity",
        Plot {
            title: "Capacity: streams held by streams offered".into(),
            x: Axis { label: "paced streams offered".into(), scale: Scale::Linear, ticks: TickFormat::Plain },
            y: Axis { label: "streams held (player's view)".into(), scale: Scale::Linear, ticks: TickFormat::Plain },
            series,
        }
        .render(),
    ));
    Ok(())
}

/// Runs one rung of `side` (`per_node` streams on each of its nodes), records it in its
/// search and in the rows; what its players saw.
#[allow(clippy::too_many_arguments)]
fn run_side_rung(
    opts: &Options,
    bed: &Bed<'_>,
    procs: &mut Procs,
    side: &mut Side,
    per_node: usize,
    step: usize,
    link: Option<u64>,
    rows: &mut Vec<Value>,
) -> Result<Rung, BenchError> {
    let plan = bed.plan;
    let buffer = plan.buffer.as_nanos() as u64;
    let (who, nodes) = (side.who, side.nodes);
    let streams = per_node * nodes;
    let top = side.search.top;
    check_stop()?;
    opts.say(format!("mars-cluster: capacity, {streams} streams on {nodes} node(s), {}", who.name()));
    let seed = 1000 + streams as u64 + step as u64;
    // CPU the servers used while the streams played (ns): nodes, and nginx's front.
    let mut cpu = (0u64, 0u64);
    // Retransmitted segments in the nodes' and the host's namespaces (the nodes
    // of both sides share namespace i, and only one side plays at a time), and
    // packets dropped from the kernel's input backlogs.
    let net0 = (procs.tcp_retransmits("nginx"), procs::backlog_drops());
    // CPU of the OSD, of this process (the players and the director), and of
    // the whole machine (other helpers' work included) while the rung ran.
    let osd_cpu = || bed.osd.as_deref().map_or(0, procs::cpu_ns_of);
    let others0 = (osd_cpu(), procs::cpu_ns_of("self"), procs::machine_busy_ns(), Instant::now());
    let pump0 = play::pump_cpu_ns();
    let played = match who {
        Who::Ours => {
            let d = start_ours_with(bed, procs, nodes as u32, plan.capacity_for(top))?;
            let c0 = procs.cpu_ns("node ");
            let res = play_all(bed, Via::Director(d.http), streams, seed, false, None, |_| Ok(()));
            cpu.0 = procs.cpu_ns("node ").saturating_sub(c0);
            for id in 1..=nodes {
                procs.stop(&format!("node {id}"));
            }
            d.stop();
            res?
        }
        Who::Nginx => {
            let front = start_front(bed, procs, nodes)?;
            let c0 = (procs.cpu_ns("nginx"), procs.cpu_ns("front"));
            let res = play_all(bed, Via::Front(front), streams, seed, false, None, |_| Ok(()));
            cpu = (procs.cpu_ns("nginx").saturating_sub(c0.0), procs.cpu_ns("front").saturating_sub(c0.1));
            procs.stop("front");
            res?
        }
    };
    let others = (
        osd_cpu().saturating_sub(others0.0),
        procs::cpu_ns_of("self").saturating_sub(others0.1),
        procs::machine_busy_ns().saturating_sub(others0.2),
        others0.3.elapsed(),
    );
    let net = (procs.tcp_retransmits("nginx").saturating_sub(net0.0), procs::backlog_drops().saturating_sub(net0.1));
    let mut rung = Rung { streams, ..Rung::default() };
    let delivered: u64 = played.iter().map(|p| p.received.bytes).sum();
    let mut on_node = [0usize; 4];
    for p in &played {
        if let Some(n) = p.nodes.0.filter(|&n| (1..=4).contains(&n)) {
            on_node[n as usize - 1] += 1;
        }
    }
    for p in &played {
        let j = judge(&p.received, plan.rate as f64, plan.chunk, plan.window);
        let ok = p.received.status / 100 == 2;
        rung.refused += usize::from(!ok);
        rung.held += usize::from(ok && !p.wrong && p.received.bytes >= plan.window && j.worst <= buffer);
        rung.aggregate +=
            j.achieved.min(2.0 * plan.rate as f64) * (p.received.bytes.min(plan.window) as f64) / plan.window as f64;
        rung.worst = rung.worst.max(j.worst);
    }
    let retry = side.search.retry == Some(per_node);
    side.search.record(per_node, rung.held == rung.streams);
    side.rungs.push(rung);
    rows.push(json!({
        "case": format!(
            "capacity, {streams} streams on {nodes} node(s){}{}: {}",
            if retry { " (again)" } else { "" },
            link.map_or_else(|| ", links unshaped".to_string(), |r| format!(", links {} Mbit/s", r / 1_000_000)),
            who.name()
        ),
        "link_bits_s": link,
        "part": "capacity", "implementation": who.name(), "nodes": nodes, "streams": streams,
        "second_try": retry,
        "offered_mb_s": (streams as u64 * plan.rate) as f64 / 1e6,
        "aggregate_mb_s": rung.aggregate / 1e6,
        "held": rung.held, "refused": rung.refused,
        "worst_lateness_ns": rung.worst,
        "nodes_cpu_s": cpu.0 as f64 / 1e9, "front_cpu_s": cpu.1 as f64 / 1e9,
        "osd_cpu_s": others.0 as f64 / 1e9, "players_director_cpu_s": others.1 as f64 / 1e9,
        // Of which the players' body reads and checks (their epoll loop's thread).
        "players_pump_cpu_s": play::pump_cpu_ns().saturating_sub(pump0) as f64 / 1e9,
        "machine_busy_cores": others.2 as f64 / 1e9 / others.3.as_secs_f64().max(1e-3),
        "delivered_mb": delivered as f64 / 1e6,
        "streams_per_node": &on_node[..nodes],
        "tcp_retransmits": net.0, "backlog_drops": net.1,
    }));
    Ok(rung)
}

/// Where resumes' time went, from the players' cuts: the director's answer (ours), the
/// serving node's response head, and from the head to the first body byte.
#[derive(Default)]
struct Phases {
    /// Kill → the player's seeing the cut.
    detect: LatencyRecorder,
    redirect: LatencyRecorder,
    head: LatencyRecorder,
    body: LatencyRecorder,
    attempts: u64,
    resumes: u64,
}

impl Phases {
    fn add(&mut self, p: &play::ResumePhases) {
        if p.detect_ns > 0 {
            self.detect.record(p.detect_ns);
        }
        if p.redirect_ns > 0 {
            self.redirect.record(p.redirect_ns);
        }
        self.head.record(p.head_ns);
        self.body.record(p.first_byte_ns.saturating_sub(p.head_ns));
        self.attempts += u64::from(p.attempts);
        self.resumes += 1;
    }
}

#[allow(clippy::too_many_arguments)]
fn failover(
    opts: &Options,
    bed: &Bed<'_>,
    procs: &mut Procs,
    whos: &[Who],
    notes: &mut Notes,
    rows: &mut Vec<Value>,
    headline: &mut Vec<Headline>,
    plots: &mut Vec<(&'static str, String)>,
) -> Result<(), BenchError> {
    let plan = bed.plan;
    // (who, resume, kill → resume, tally, resumes for the plot, stalls of the killed node's streams,
    // where the resumes' time went)
    type Entry = (Who, LatencyRecorder, LatencyRecorder, Tally, Vec<u64>, LatencyRecorder, Phases);
    let mut resume: Vec<Entry> = whos
        .iter()
        .map(|&w| {
            (
                w,
                LatencyRecorder::new(),
                LatencyRecorder::new(),
                Tally::default(),
                Vec::new(),
                LatencyRecorder::new(),
                Phases::default(),
            )
        })
        .collect();
    let mut director: Option<RunningDirector> = None;
    let mut front: Option<SocketAddr> = None;
    let result = (|| -> Result<(), BenchError> {
        for round in 0..plan.failover_rounds {
            for &who in whos {
                check_stop()?;
                opts.say(format!(
                    "mars-cluster: failover round {} of {}, {}",
                    round + 1,
                    plan.failover_rounds,
                    who.name()
                ));
                let via = match who {
                    Who::Ours => {
                        if director.is_none() {
                            director = Some(start_ours(bed, procs, 2)?);
                        }
                        Via::Director(director.as_ref().map(|d| d.http).expect("started"))
                    }
                    Who::Nginx => {
                        if front.is_none() {
                            front = Some(start_front(bed, procs, 2)?);
                        }
                        Via::Front(front.expect("started"))
                    }
                };
                let clock: KillClock = Arc::new(Mutex::new(None));
                let mut killed = None;
                let played =
                    play_all(bed, via, plan.failover_streams, 100 + round as u64, true, Some(&clock), |nodes| {
                        // Every stream playing for a while, then the first one's node dies.
                        let t = Instant::now();
                        while nodes.iter().any(|n| n.lock().map_or(true, |n| n.is_none())) {
                            if t.elapsed() > Duration::from_secs(30) {
                                return Err(err("failover", "the streams did not all start within 30 s"));
                            }
                            nap(Duration::from_millis(10))?;
                        }
                        nap(Duration::from_secs_f64(plan.window as f64 / plan.rate as f64 / 3.0))?;
                        let victim = nodes[0].lock().ok().and_then(|n| *n).unwrap_or(1);
                        if let Ok(mut c) = clock.lock() {
                            *c = Some((Instant::now(), victim));
                        }
                        procs.kill9(&match who {
                            Who::Ours => format!("node {victim}"),
                            Who::Nginx => format!("nginx{victim}"),
                        });
                        killed = Some(victim);
                        Ok(())
                    })?;
                let entry = resume.iter_mut().find(|e| e.0 == who).expect("listed");
                for p in &played {
                    // The stall its player saw (with a one-chunk buffer): the worst
                    // lateness of a slot, over what it played.
                    if p.nodes.0.is_some() && p.nodes.0 == killed {
                        let j = judge(&p.received, plan.rate as f64, plan.chunk, p.received.bytes);
                        entry.5.record(j.worst);
                    }
                    for &r in &p.resume_ns {
                        entry.1.record(r);
                        entry.4.push(r);
                    }
                    entry.2.record_all(&p.kill_to_resume_ns);
                    for ph in &p.resume_phases {
                        entry.6.add(ph);
                    }
                }
                let t = tally(bed, &played, true);
                if !t.errors.is_empty() {
                    notes.push(format!(
                        "failover, {} round {}: {} of {} streams did not finish, first: {}",
                        who.name(),
                        round + 1,
                        t.errors.len(),
                        t.streams,
                        t.errors[0]
                    ));
                }
                entry.3.streams += t.streams;
                entry.3.held += t.held;
                entry.3.late += t.late;
                entry.3.slots += t.slots;
                entry.3.wrong += t.wrong;
                // The killed node comes back for the next round.
                if let Some(v) = killed {
                    match who {
                        Who::Ours => {
                            let d = director.as_ref().expect("started");
                            procs.node(&spec(bed, d.nodes), v, bed.places.get(v as usize - 1), &node_log(bed, v))?;
                            wait_nodes(bed, d, procs, 2)?;
                        }
                        Who::Nginx => start_nginx_node(bed, procs, v)?,
                    }
                }
            }
        }
        Ok(())
    })();
    if let Some(d) = director.take() {
        let snap = d.snapshot();
        notes.push(format!(
            "failover (ours): the director moved {} stream(s), dropped {}, closed {} whose players had stopped",
            snap.moved, snap.dropped, snap.closed
        ));
        for id in 1..=2 {
            procs.stop(&format!("node {id}"));
        }
        d.stop();
    }
    if front.is_some() {
        procs.stop("front");
    }
    result?;
    for (who, r, k, t, _, stall, ph) in &resume {
        rows.push(
            stall
                .row(format!("failover stall (worst slot lateness, streams of the killed node): {}", who.name()))
                .with("part", "failover")
                .with("implementation", who.name())
                .to_value(),
        );
        rows.push(
            r.row(format!("failover resume (cut seen → first byte from another node): {}", who.name()))
                .with("part", "failover")
                .with("implementation", who.name())
                .with("kill_to_resume_p50_ns", k.quantile(0.5))
                .with("kill_to_resume_p99_ns", k.quantile(0.99))
                .with("streams", t.streams as u64)
                .with("held", t.held as u64)
                .with("late_slots", t.late)
                .with("slots", t.slots)
                .with("wrong_bytes_streams", t.wrong as u64)
                .with("detection_p50_ns", ph.detect.quantile(0.5))
                .with("detection_p99_ns", ph.detect.quantile(0.99))
                .with("redirect_p50_ns", ph.redirect.quantile(0.5))
                .with("head_p50_ns", ph.head.quantile(0.5))
                .with("head_p99_ns", ph.head.quantile(0.99))
                .with("head_to_first_byte_p50_ns", ph.body.quantile(0.5))
                .with("head_to_first_byte_p99_ns", ph.body.quantile(0.99))
                .with("requests_per_resume", ph.attempts as f64 / ph.resumes.max(1) as f64)
                .to_value(),
        );
    }
    let p50 = |w: Who| resume.iter().find(|e| e.0 == w && e.1.count() > 0).map(|e| e.1.quantile(0.5) as f64 / 1e6);
    if let Some(ours) = p50(Who::Ours) {
        let peer = p50(Who::Nginx);
        headline.push(Headline::new(
            "mars_failover_resume_ms",
            ours,
            peer.unwrap_or(f64::NAN),
            "nginx front re-asked with Range after its node died (proxy_next_upstream)",
            "ms",
            Better::Lower,
        ));
    }
    notes.push(format!(
        "failover: 2 nodes, {} streams at {:.1} MB/s per round ({:.0} MB windows, longer than nginx's socket buffers hold); once all play, after {:.1} s, the first stream's node gets SIGKILL; a player cut off asks again from the byte it reached (ours: the director with stream=S; nginx: the front); players stop {:.0} s after the kill, those of the killed node once resumed (nginx's: once the buffered rest ran out, the cut seen, and resumed) or at the window's end; the node is restarted before the next round; {} round(s) each, alternating; resume p50 in the headline, p99 in the rows; stall = the worst lateness of a 64 KiB slot of the killed node's streams (nginx's unpaced sends leave megabytes in socket buffers, which can carry a player past a cut)",
        plan.failover_streams,
        plan.rate as f64 / 1e6,
        plan.failover_window as f64 / 1e6,
        plan.window as f64 / plan.rate as f64 / 3.0,
        plan.after_kill.as_secs_f64(),
        plan.failover_rounds
    ));
    let series = resume
        .iter()
        .filter(|e| !e.4.is_empty())
        .map(|(who, _, _, _, v, _, _)| {
            let mut v = v.clone();
            v.sort_unstable();
            let n = v.len();
            Series {
                name: match who {
                    Who::Ours => "ours (director)".to_string(),
                    Who::Nginx => "nginx front".to_string(),
                },
                points: v.iter().enumerate().map(|(i, &ns)| ((i + 1) as f64 / n as f64 * 100.0, ns as f64)).collect(),
            }
        })
        .collect::<Vec<_>>();
    if !series.is_empty() {
        plots.push((
            "-failover",
            Plot {
                title: "Resume after kill -9 of a node: cut seen → first byte from another node".into(),
                x: Axis { label: "percent of resumes".into(), scale: Scale::Linear, ticks: TickFormat::Plain },
                y: Axis { label: "resume time".into(), scale: Scale::Log10, ticks: TickFormat::Nanoseconds },
                series,
            }
            .render(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Search;

    /// Runs a search against a side that holds every rung up to `cap` streams per node,
    /// except the rungs listed in `flaky` the first time they are run; the rungs run.
    fn run(top: usize, fine: usize, cap: usize, flaky: &[usize]) -> (Search, Vec<usize>) {
        let mut s = Search::new(top, fine);
        let mut ran = Vec::new();
        let mut flaky = flaky.to_vec();
        while let Some(r) = s.next() {
            assert!(ran.len() < 64, "the search ends: {ran:?}");
            let first = !ran.contains(&r);
            ran.push(r);
            let lost = first && flaky.contains(&r);
            flaky.retain(|&x| x != r || !first);
            s.record(r, r <= cap && !lost);
        }
        (s, ran)
    }

    #[test]
    fn doubles_then_halves_down_to_the_resolution() {
        let (s, ran) = run(32, 4, 20, &[]);
        // 1 2 4 8 16 32 (failed, again), 24 (failed, again), then 20 held: gap 24-20 ≤ 5.
        assert_eq!(ran, [1, 2, 4, 8, 16, 32, 32, 24, 24, 20]);
        assert_eq!((s.held, s.failed, s.ceiling()), (20, Some(24), false));
    }

    #[test]
    fn a_failed_rung_is_run_again_and_the_better_counts() {
        let (s, ran) = run(32, 4, 20, &[4, 16]);
        assert_eq!(&ran[..7], &[1, 2, 4, 4, 8, 16, 16]);
        assert_eq!(s.held, 20);
        // Nothing held: 1 is run twice and the search ends with 0 held.
        let (s, ran) = run(32, 4, 0, &[]);
        assert_eq!((ran, s.held, s.failed), (vec![1, 1], 0, Some(1)));
    }

    #[test]
    fn the_top_bounds_it_and_says_so() {
        let (s, ran) = run(24, 8, 1000, &[]);
        assert_eq!(ran, [1, 2, 4, 8, 16, 24]);
        assert!(s.ceiling());
        assert_eq!(s.held, 24);
    }

    #[test]
    fn never_claims_more_than_held_nor_less_than_the_resolution() {
        for top in [1usize, 3, 8, 32, 128] {
            for fine in [1usize, 4, 8] {
                for cap in 0..=top + 2 {
                    let (s, _) = run(top, fine, cap, &[1, 3, 7]);
                    let truth = cap.min(top);
                    assert!(s.held <= truth, "top {top} fine {fine} cap {cap}: {s:?}");
                    assert!(truth - s.held <= (s.held / fine).max(1), "top {top} fine {fine} cap {cap}: {s:?}");
                }
            }
        }
    }
}
