//! `ictus mars …`: volumes, the server, its control port.

use std::path::PathBuf;

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

#[derive(Args, Debug)]
struct ServeArgs {
    /// The volume's components, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    volume: Vec<PathBuf>,
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
    if a.buffer_size.get() % 4096 != 0 {
        return Err(format!("--buffer-size {}: not a multiple of 4096", a.buffer_size.get()).into());
    }
    let engine = EngineConfig {
        device_depth: a.depth.as_usize(),
        buffers: a.buffers.as_usize(),
        buf_size: a.buffer_size.as_usize(),
        max_connections: a.max_connections.as_usize(),
        rt_reserve: a.rt_reserve.get() / 100.0,
        fifo: (!a.timesharing).then(|| a.fifo.get()),
        splice: !a.no_splice,
        readahead: ictus_mars::readahead::ReadAhead {
            floor_ns: u64::try_from(a.min_readahead.get().as_nanos()).unwrap_or(u64::MAX),
            ..ictus_mars::readahead::ReadAhead::default()
        },
        ..EngineConfig::default()
    };
    raise_nofile();
    let running = crate::start(&StartOptions {
        volume: a.volume,
        listen: Some(a.listen),
        capability: a.capability.map(Rate::get),
        engine,
        force_fallback: false,
    })?;
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
    running.stop();
    eprintln!("ictus mars: stopped");
    result
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
