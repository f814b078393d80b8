//! `ictus mars …`: volumes, the server, its control port.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{Args, Subcommand};
use ictus_args::{Bytes, Count, Percent, Priority, Rate, Seconds};
use ictus_ipc::Space;
use ictus_mars_api::client::{default_control_socket_path, prepare_default_control_socket_path};
use ictus_mars_api::{Control, Stats, SERVICE_NAME};
use ictus_server::{serve_until_signalled, Listener, Registrar};

use crate::api::ApiServer;
use crate::{EngineConfig, StartOptions, Volume};

/// `ictus mars`.
#[derive(Args, Debug)]
pub struct MarsArgs {
    #[command(subcommand)]
    command: MarsCommand,
}

#[derive(Subcommand, Debug)]
enum MarsCommand {
    /// Striped volumes: create, add streams, describe, measure.
    Volume {
        #[command(subcommand)]
        command: VolumeCommand,
    },
    /// Serve a volume: HTTP for players, the streams API on ports (registered as "mars"
    /// with the name server), the control port on the control socket.
    Serve(ServeArgs),
    /// Upload a file to a Ceph cluster as a clip (striped; a `.ts` file also gets its
    /// HLS playlist, NAME.m3u8), for nodes started with `serve --cluster`.
    Put(PutArgs),
    /// The director of stream nodes over one Ceph cluster: clients ask it for a clip over
    /// HTTP and are redirected to the node chosen by cache and load; nodes register on
    /// its nodes' port (`serve --director`); a node that dies has its streams moved.
    Director(DirectorArgs),
    /// Make a new cluster key (32 random bytes as hex, in a new file of mode 0600) for
    /// `director --cluster-key` and `serve --cluster-key`: only nodes that hold it can
    /// register with the director. Copy it to each node's machine, readable only by
    /// the user that runs ictus there.
    ClusterKey {
        /// The new key file (an existing file is not overwritten).
        file: PathBuf,
    },
    /// Set a Deficit Round Robin class's quantum (sectors) through the control port;
    /// a new name adds a weighted class.
    Quantum {
        /// Class name (rt, nrt, or a new one).
        class: String,
        /// Sectors (512 bytes) per round (1 to 4294967295; at least the largest read,
        /// which the server checks).
        #[arg(value_name = "SECTORS", value_parser = ictus_args::count(1, u64::from(u32::MAX)))]
        sectors: Count,
        /// The control socket [default: mars-control.sock beside the name server's].
        #[arg(long)]
        control_socket: Option<PathBuf>,
    },
    /// The server's classes and counters, through the control port.
    Stats {
        /// The control socket [default: as for `quantum`].
        #[arg(long)]
        control_socket: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum VolumeCommand {
    /// Make a volume over files or block devices (every label is overwritten).
    Create {
        /// Bytes per stripe unit, a multiple of 4096 (4096 to 16777216).
        #[arg(long, value_name = "BYTES", default_value = "65536", value_parser = ictus_args::bytes(4096, ictus_mars::label::MAX_INTERLEAVE))]
        interleave: Bytes,
        /// Create missing component files with this size, in bytes (65536 to
        /// 1125899906842624, a PiB).
        #[arg(long, value_name = "BYTES", value_parser = ictus_args::bytes(ictus_mars::label::LABEL_BYTES, 1 << 50))]
        size: Option<Bytes>,
        /// The components, in stripe order.
        #[arg(required = true)]
        components: Vec<PathBuf>,
    },
    /// Add a file as a stream (a `.ts` file also gets an HLS playlist, NAME.m3u8).
    Add {
        /// The volume's components, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        volume: Vec<PathBuf>,
        /// The stream's name.
        name: String,
        /// The file to copy in.
        file: PathBuf,
        /// Target segment duration of the playlist, seconds (0.1 to 3600).
        #[arg(long, value_name = "SECONDS", default_value = "4", value_parser = ictus_args::seconds(0.1, 3600.0))]
        hls_target: Seconds,
    },
    /// Describe a volume: geometry, components, streams.
    Info {
        /// The components (any order).
        #[arg(required = true)]
        components: Vec<PathBuf>,
    },
    /// Measure what the volume delivers (O_DIRECT reads, the engine's queue depth).
    Bench {
        /// The components.
        #[arg(required = true)]
        components: Vec<PathBuf>,
        /// Reads in flight per component (1 to 256).
        #[arg(long, value_name = "N", default_value = "4", value_parser = ictus_args::count(1, 256))]
        depth: Count,
        /// How long to measure, seconds (0.1 to 600).
        #[arg(long, value_name = "SECONDS", default_value = "3", value_parser = ictus_args::seconds(0.1, 600.0))]
        seconds: Seconds,
    },
}

/// Where the clips of a Ceph cluster are.
#[derive(Args, Debug, Clone)]
struct ClusterArgs {
    /// The Ceph cluster's configuration file (`scripts/ceph.sh up` prints it).
    #[arg(long, value_name = "CONF")]
    cluster: Option<PathBuf>,
    /// The pool holding the clips [default: ictus].
    // No clap default here and for `cache`/`ahead`, and `serve` checks `--pool`
    // itself: clap drops a `requires` whose target conflicts with a present argument
    // (`--cluster` with `--volume`), so `serve --volume V --pool P` was accepted and P
    // ignored. `cache`/`ahead` conflict with `--volume` instead.
    #[arg(long, requires = "cluster")]
    pool: Option<String>,
}

impl ClusterArgs {
    fn pool(&self) -> &str {
        self.pool.as_deref().unwrap_or("ictus")
    }
}

#[derive(Args, Debug)]
struct PutArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The clip's name.
    name: String,
    /// The file to upload.
    file: PathBuf,
    /// Target segment duration of the playlist, seconds (0.1 to 3600).
    #[arg(long, value_name = "SECONDS", default_value = "4", value_parser = ictus_args::seconds(0.1, 3600.0))]
    hls_target: Seconds,
}

#[derive(Args, Debug)]
struct DirectorArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The cluster key (`ictus mars cluster-key FILE` makes one): nodes prove they hold
    /// it to register. The file must be readable by its owner only (mode 0600).
    #[arg(long, value_name = "FILE", required = true)]
    cluster_key: PathBuf,
    /// HTTP address clients ask.
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: String,
    /// Address nodes register on.
    #[arg(long, default_value = "127.0.0.1:8091")]
    nodes_listen: String,
    /// Bytes/s a stream that names no `rate` counts for admission (1 to 1000000000000).
    #[arg(long, value_name = "BYTES_PER_S", default_value = "500000", value_parser = ictus_args::rate(1.0, 1e12))]
    default_rate: Rate,
    /// Bytes/s the cluster serves to nodes without a clip cached (1 to 1000000000000).
    #[arg(long, value_name = "BYTES_PER_S", default_value = "100000000", value_parser = ictus_args::rate(1.0, 1e12))]
    store_capacity: Rate,
    /// A node silent this long is dead, seconds (0.1 to 600).
    #[arg(long, value_name = "SECONDS", default_value = "2", value_parser = ictus_args::seconds(0.1, 600.0))]
    heartbeat_timeout: Seconds,
    /// A stream its node does not report open this long after it was placed (or
    /// moved) is closed: its player stopped, seconds (0.1 to 600).
    #[arg(long, value_name = "SECONDS", default_value = "3", value_parser = ictus_args::seconds(0.1, 600.0))]
    close_grace: Seconds,
    /// Bounded-load placement: a node caching the clip is preferred only while its load
    /// after placing is at most this percentage of the cluster's average load fraction
    /// (100 to 10000; default 125: a caching node takes a clip's streams until it is 25 %
    /// busier than the average, so no node idles while another fills; 10000 is in effect
    /// the caching node first, unbounded — fewer reads from the store, uneven nodes; see
    /// doc/mars-cluster.md).
    #[arg(long, value_name = "PERCENT", value_parser = ictus_args::count(100, 10_000))]
    cache_bound: Option<Count>,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// The volume's components, comma-separated.
    #[arg(long, value_delimiter = ',', required_unless_present = "cluster", conflicts_with = "cluster")]
    volume: Vec<PathBuf>,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Bytes of the node's stripe cache with `--cluster` (16777216 to 1099511627776)
    /// [default: 268435456, `CephOptions::new`'s].
    #[arg(long, value_name = "BYTES", requires = "cluster", conflicts_with = "volume", value_parser = ictus_args::bytes(16 << 20, 1 << 40))]
    cache: Option<Bytes>,
    /// Bytes read ahead of each stream from the cluster (1048576 to 1073741824)
    /// [default: 8388608].
    #[arg(long, value_name = "BYTES", requires = "cluster", conflicts_with = "volume", value_parser = ictus_args::bytes(1 << 20, 1 << 30))]
    ahead: Option<Bytes>,
    /// Register with the director at this nodes' address (host:port) and report load.
    #[arg(long, value_name = "ADDR", requires_all = ["node_id", "cluster_key"])]
    director: Option<std::net::SocketAddr>,
    /// The cluster key, the director's (a copy readable by its owner only, mode 0600):
    /// registering proves the node holds it.
    #[arg(long, value_name = "FILE", requires = "director")]
    cluster_key: Option<PathBuf>,
    /// This node's id at the director (1 to 4294967295).
    #[arg(long, value_name = "N", requires = "director", value_parser = ictus_args::count(1, u64::from(u32::MAX)))]
    node_id: Option<Count>,
    /// The address clients are sent to [default: the HTTP address listened on].
    #[arg(long, value_name = "ADDR", requires = "director")]
    advertise: Option<std::net::SocketAddr>,
    /// HTTP address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Bytes per second admission control works from (1 to 1000000000000)
    /// [default: measured at start].
    #[arg(long, value_name = "BYTES_PER_S", value_parser = ictus_args::rate(1.0, 1e12))]
    capability: Option<Rate>,
    /// Percentage of the capability promised to real-time streams (0 to 100).
    #[arg(long, value_name = "PERCENT", default_value = "80", value_parser = ictus_args::percent(0.0, 100.0))]
    rt_reserve: Percent,
    /// Device reads in flight per component, the paper's adapter queue (1 to 256).
    #[arg(long, value_name = "N", default_value = "4", value_parser = ictus_args::count(1, 256))]
    depth: Count,
    /// Registered buffers (4 to 65535).
    #[arg(long, value_name = "N", default_value = "256", value_parser = ictus_args::count(4, u64::from(u16::MAX)))]
    buffers: Count,
    /// Bytes per buffer, a multiple of 4096 (4096 to 16777216).
    #[arg(long, value_name = "BYTES", default_value = "262144", value_parser = ictus_args::bytes(4096, 16 << 20))]
    buffer_size: Bytes,
    /// Most HTTP connections (1 to 1000000).
    #[arg(long, value_name = "N", default_value = "16384", value_parser = ictus_args::count(1, 1_000_000))]
    max_connections: Count,
    /// Run the engine thread at this SCHED_FIFO priority (1 to 99), below the upcalls
    /// that pace the streams, so timesharing load does not delay their sends. If
    /// refused, serve anyway and say so.
    #[arg(long, value_name = "PRIORITY", default_value = "50", value_parser = ictus_args::priority(1, 99))]
    fifo: Priority,
    /// Run the engine thread timesharing (no SCHED_FIFO).
    #[arg(long, conflicts_with = "fifo")]
    timesharing: bool,
    /// Downloads (requests without ?rate=) read with O_DIRECT into the registered
    /// buffers, as paced streams do, instead of being spliced from the page cache.
    #[arg(long)]
    no_splice: bool,
    /// Splice every download from the page cache, cold ones too (by default a download
    /// whose range is mostly not cached is read with O_DIRECT into the registered
    /// buffers, leaving the page cache to what is asked for again).
    #[arg(long, conflicts_with = "no_splice")]
    page_cache_always: bool,
    /// Page-cache downloads spliced by io_uring (IORING_OP_SPLICE through a pipe, in
    /// its worker threads) instead of sent by sendfile(2) on the download thread.
    #[arg(long, conflicts_with = "no_splice")]
    io_uring_splice: bool,
    /// Least time of stream a paced stream keeps read ahead, seconds (0 to 60); it reads
    /// further ahead when the devices' measured latency asks for it.
    #[arg(long, value_name = "SECONDS", default_value = "0.5", value_parser = ictus_args::seconds(0.0, 60.0))]
    min_readahead: Seconds,
    /// Do not register with the name server (HTTP only, no streams API).
    #[arg(long, conflicts_with_all = ["name_server", "control_socket"])]
    no_ports: bool,
    /// The name server's socket [default: as for `ictus name-server`].
    #[arg(long)]
    name_server: Option<PathBuf>,
    /// The control socket [default: mars-control.sock beside the name server's].
    #[arg(long)]
    control_socket: Option<PathBuf>,
}

fn control(path: Option<PathBuf>) -> Result<Control, ictus_mars_api::ConnectError> {
    let space = Space::task();
    Control::connect_socket(&space, &path.unwrap_or_else(default_control_socket_path))
}

/// Runs `ictus mars …`.
pub fn main(args: MarsArgs) -> Result<(), Box<dyn std::error::Error>> {
    match args.command {
        MarsCommand::Volume { command } => volume(command),
        MarsCommand::Serve(a) => serve(a),
        MarsCommand::Put(a) => put(a),
        MarsCommand::Director(a) => director(a),
        MarsCommand::ClusterKey { file } => {
            ictus_mars_cluster::ClusterKey::create(&file)?;
            println!("cluster key in {} (mode 0600): copy it to each node, readable by its user only", file.display());
            Ok(())
        }
        MarsCommand::Quantum { class, sectors, control_socket } => {
            let sectors = u32::try_from(sectors.get()).unwrap_or(u32::MAX);
            control(control_socket)?.set_quantum(&class, sectors)?;
            println!("{class}: {sectors} sectors per round");
            Ok(())
        }
        MarsCommand::Stats { control_socket } => {
            let c = control(control_socket)?;
            for class in c.classes()? {
                println!("class {}: quantum {} sectors, {} sectors served", class.name, class.quantum, class.served);
            }
            let w = c.streams().stats()?.to_words();
            for (n, v) in Stats::NAMES.iter().zip(w) {
                println!("{n} {v}");
            }
            Ok(())
        }
    }
}

fn volume(cmd: VolumeCommand) -> Result<(), Box<dyn std::error::Error>> {
    match cmd {
        VolumeCommand::Create { interleave, size, components } => {
            if interleave.get() % ictus_mars::label::ALIGN != 0 {
                return Err(format!("--interleave {}: not a multiple of 4096", interleave.get()).into());
            }
            let v = Volume::create(&components, interleave.get(), size.map(Bytes::get))?;
            print!("{}", v.describe());
        }
        VolumeCommand::Add { volume, name, file, hls_target } => {
            let mut v = Volume::open(&volume)?;
            let pl = v.add_file(&name, &file, hls_target.get().as_secs_f64())?;
            println!("added {name}");
            if let Some(pl) = pl {
                println!("added {pl} (HLS playlist with byte ranges)");
            }
        }
        VolumeCommand::Info { components } => print!("{}", Volume::open(&components)?.describe()),
        VolumeCommand::Bench { components, depth, seconds } => {
            let s = crate::LocalStorage::open(&components)?;
            let depth = depth.as_usize();
            let rate = crate::measure::capability(&s, depth, seconds.get())?;
            println!(
                "{:.1} MB/s ({} reads, {} in flight per component)",
                rate / 1e6,
                if crate::Storage::direct(&s) { "O_DIRECT" } else { "page-cache" },
                depth
            );
        }
    }
    Ok(())
}

fn serve(a: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    if a.cluster.cluster.is_none() && a.cluster.pool.is_some() {
        return Err("--pool names the Ceph pool of --cluster; a --volume has none".into());
    }
    if a.buffer_size.get() % 4096 != 0 {
        return Err(format!("--buffer-size {}: not a multiple of 4096", a.buffer_size.get()).into());
    }
    // Before anything starts: a key that cannot be used is said at once.
    let key = a.cluster_key.as_deref().map(ictus_mars_cluster::ClusterKey::load).transpose()?;
    let engine = EngineConfig {
        device_depth: a.depth.as_usize(),
        buffers: a.buffers.as_usize(),
        buf_size: a.buffer_size.as_usize(),
        max_connections: a.max_connections.as_usize(),
        rt_reserve: a.rt_reserve.get() / 100.0,
        fifo: (!a.timesharing).then(|| a.fifo.get()),
        splice: !a.no_splice,
        sendfile: !a.io_uring_splice,
        cold_direct: !a.page_cache_always,
        readahead: ictus_mars::readahead::ReadAhead {
            floor_ns: u64::try_from(a.min_readahead.get().as_nanos()).unwrap_or(u64::MAX),
            ..ictus_mars::readahead::ReadAhead::default()
        },
        ..EngineConfig::default()
    };
    raise_nofile();
    let engine_for_capacity = engine.clone();
    let opts = StartOptions {
        volume: a.volume,
        listen: Some(a.listen),
        capability: a.capability.map(Rate::get),
        engine,
        force_fallback: false,
    };
    let (running, ceph) = match &a.cluster.cluster {
        Some(conf) => {
            let mut c = crate::ceph::CephOptions::new(conf.clone(), a.cluster.pool().to_string());
            if let Some(b) = a.cache {
                c.cache_bytes = b.get();
            }
            if let Some(b) = a.ahead {
                c.ahead = b.get();
            }
            let (r, s) = crate::start_cluster(&c, &opts)?;
            (r, Some(s))
        }
        None => (crate::start(&opts)?, None),
    };
    let agent_stop = Arc::new(AtomicBool::new(false));
    let agent = match (a.director, a.node_id, running.addr, key) {
        (Some(dir), Some(id), Some(addr), Some(key)) => {
            let (stop, handle) = (Arc::clone(&agent_stop), running.handle.clone());
            let http = a.advertise.unwrap_or(addr);
            // The director places paced streams: tell it what the engine admits of them
            // (the smallest of its limits).
            let cap = crate::engine::paced_capacity(&engine_for_capacity, running.capability);
            let id = u32::try_from(id.get()).unwrap_or(u32::MAX);
            eprintln!("ictus mars: node {id} reporting to the director at {dir}, clients sent to {http}");
            Some(std::thread::Builder::new().name("ictus-mars-agent".into()).spawn(move || {
                ictus_mars_cluster::service::node_agent(
                    &ictus_mars_cluster::service::NodeIdentity { director: dir, id, http, capacity: cap, key },
                    std::time::Duration::from_millis(250),
                    || node_report(handle.as_ref(), ceph.as_deref()),
                    &stop,
                )
            })?)
        }
        _ => None,
    };
    eprintln!(
        "ictus mars: HTTP on {}; capability {:.1} MB/s ({}), pid {}",
        running.addr.map_or("?".to_string(), |x| x.to_string()),
        running.capability / 1e6,
        if running.direct { "O_DIRECT" } else { "page cache" },
        std::process::id()
    );
    let result: Result<(), Box<dyn std::error::Error>> = serve_until_signalled(|stop| {
        let Some(handle) = running.handle.clone().filter(|_| !a.no_ports) else {
            // HTTP only: wait for the signal.
            let mut b = [0u8; 1];
            let _ = rustix::io::read(stop, &mut b);
            return Ok(());
        };
        let space = Space::task();
        let mut api = ApiServer::new(space.clone(), handle)?;
        let path = match a.control_socket {
            Some(p) => p,
            None => prepare_default_control_socket_path()?,
        };
        let listener = Listener::bind(&path, "mars server")?;
        let names = Registrar::start("mars", a.name_server.as_deref(), &space, &[(SERVICE_NAME, api.streams_port())])?;
        eprintln!("ictus mars: streams port registered as {SERVICE_NAME:?}; control port on {}", path.display());
        let r = api.run(Some(&listener), stop);
        names.stop();
        r.map_err(Into::into)
    });
    agent_stop.store(true, Ordering::Release);
    if let Some(t) = agent {
        let _ = t.join();
    }
    running.stop();
    eprintln!("ictus mars: stopped");
    result
}

/// What a node tells the director each beat: its connections, the clips in its stripe
/// cache, the director's streams it is sending.
pub fn node_report(
    handle: Option<&crate::EngineHandle>,
    ceph: Option<&crate::ceph::CephStorage>,
) -> ictus_mars_cluster::service::Report {
    let stats = handle.and_then(|h| h.stats()).unwrap_or_default();
    ictus_mars_cluster::service::Report {
        connections: stats.connections,
        clips: ceph.map(|c| c.cached_clips()).unwrap_or_default(),
        open: stats.open_tags,
    }
}

fn connect_cluster(c: &ClusterArgs) -> Result<ictus_objstore::Striper, Box<dyn std::error::Error>> {
    let conf = c.cluster.as_ref().ok_or("--cluster CONF is required")?;
    let rados = ictus_objstore::Rados::connect(conf, 10)?;
    Ok(rados.striper(c.pool(), ictus_objstore::Layout::default())?)
}

fn put(a: PutArgs) -> Result<(), Box<dyn std::error::Error>> {
    if !ictus_mars::label::valid_name(&a.name) {
        return Err(
            format!("bad clip name {:?} (1 to 64 of A-Z a-z 0-9 . _ - /, no empty or dot components)", a.name).into()
        );
    }
    let striper = connect_cluster(&a.cluster)?;
    let len = striper.put_file(&a.name, &a.file)?;
    println!("put {} ({len} bytes)", a.name);
    if let Some(stem) = a.name.strip_suffix(".ts") {
        let data = std::fs::read(&a.file)?;
        let mut ix = ictus_mars::hls::TsIndexer::new();
        ix.feed(&data);
        if let Ok(segments) = ix.segments(len, a.hls_target.get().as_secs_f64()) {
            let uri = a.name.rsplit('/').next().unwrap_or(&a.name);
            let text = ictus_mars::hls::playlist(uri, &segments);
            let pl = format!("{stem}.m3u8");
            if ictus_mars::label::valid_name(&pl) {
                striper.put(&pl, &mut text.as_bytes(), text.len() as u64)?;
                println!("put {pl} (HLS playlist with byte ranges)");
            }
        }
    }
    Ok(())
}

/// The director's catalog: clip lengths from the cluster (`stat`).
struct ClusterCatalog(ictus_objstore::Striper);

impl ictus_mars_cluster::service::Catalog for ClusterCatalog {
    fn len(&self, name: &str) -> Option<u64> {
        self.0.stat(name).ok()
    }
}

fn director(a: DirectorArgs) -> Result<(), Box<dyn std::error::Error>> {
    use ictus_mars_cluster::service::{DirectorOptions, RunningDirector};
    let key = ictus_mars_cluster::ClusterKey::load(&a.cluster_key)?;
    let striper = connect_cluster(&a.cluster)?;
    let http = crate::listen_tcp(&a.listen).map_err(|e| format!("listening on {}: {e}", a.listen))?;
    let nodes = crate::listen_tcp(&a.nodes_listen).map_err(|e| format!("listening on {}: {e}", a.nodes_listen))?;
    let opts = DirectorOptions {
        config: ictus_mars_cluster::Config {
            heartbeat_timeout_ns: u64::try_from(a.heartbeat_timeout.get().as_nanos()).unwrap_or(u64::MAX),
            store_capacity: a.store_capacity.get() as u64,
            // Unset: bounded-load placement at CACHE_BOUND_PCT (125 %); cache first,
            // unbounded, left a node idle (doc/mars-cluster.md has the trade-off).
            cache_bound_pct: Some(
                a.cache_bound
                    .map_or(ictus_mars_cluster::CACHE_BOUND_PCT, |c| u32::try_from(c.get()).unwrap_or(u32::MAX)),
            ),
        },
        default_rate: a.default_rate.get() as u64,
        tick: std::time::Duration::from_millis(100),
        close_grace: a.close_grace.get(),
        key,
    };
    let d = RunningDirector::start(http, nodes, Box::new(ClusterCatalog(striper)), opts)?;
    eprintln!("ictus mars director: clients on {}, nodes on {}, pid {}", d.http, d.nodes, std::process::id());
    let r: Result<(), Box<dyn std::error::Error>> = serve_until_signalled(|stop| {
        let mut b = [0u8; 1];
        let _ = rustix::io::read(stop, &mut b);
        Ok(())
    });
    d.stop();
    eprintln!("ictus mars director: stopped");
    r
}

/// Raises the soft open-files limit to the hard one: every connection is a descriptor.
pub fn raise_nofile() {
    if let Ok(lim) = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum.ok_or(()) {
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit { current: Some(lim), maximum: Some(lim) },
        );
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Cmd {
        #[command(flatten)]
        mars: MarsArgs,
    }

    fn director_args(extra: &[&str]) -> Result<DirectorArgs, clap::Error> {
        let mut argv = vec!["mars", "director", "--cluster", "/x/ceph.conf", "--cluster-key", "/x/key"];
        argv.extend_from_slice(extra);
        match Cmd::try_parse_from(argv)?.mars.command {
            MarsCommand::Director(a) => Ok(a),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn the_director_and_a_node_need_the_cluster_key() {
        let argv = ["mars", "director", "--cluster", "/x/ceph.conf"];
        assert!(Cmd::try_parse_from(argv).is_err(), "a director without --cluster-key");
        let serve = ["mars", "serve", "--cluster", "/x/ceph.conf", "--director", "127.0.0.1:1", "--node-id", "1"];
        assert!(Cmd::try_parse_from(serve).is_err(), "a node without --cluster-key");
        let mut with = serve.to_vec();
        with.extend(["--cluster-key", "/x/key"]);
        assert!(Cmd::try_parse_from(with).is_ok());
        assert!(
            Cmd::try_parse_from(["mars", "serve", "--volume", "/v", "--cluster-key", "/x/key"]).is_err(),
            "a key without a director"
        );
    }

    #[test]
    fn cache_bound_is_checked_and_defaults_in_the_config() {
        assert!(director_args(&[]).unwrap().cache_bound.is_none());
        assert_eq!(director_args(&["--cache-bound", "125"]).unwrap().cache_bound.map(|c| c.get()), Some(125));
        for bad in ["99", "0", "-5", "12.5", "10001", "x", ""] {
            assert!(director_args(&["--cache-bound", bad]).is_err(), "{bad:?} accepted");
        }
    }
}
