//! `ictus mars …`: volumes, the server, its control port.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
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
        /// Sectors (512 bytes) per round.
        sectors: u32,
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
        /// Bytes per stripe unit (a multiple of 4096; K and M suffixes).
        #[arg(long, default_value = "64K", value_parser = parse_size)]
        interleave: u64,
        /// Create missing component files with this size (K, M, G suffixes).
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
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
        /// Target segment duration of the playlist, seconds.
        #[arg(long, default_value_t = 4.0)]
        hls_target: f64,
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
        /// Reads in flight per component.
        #[arg(long, default_value_t = 4)]
        depth: usize,
        /// Seconds.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
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
    /// Bytes/s admission control works from [default: measured at start].
    #[arg(long)]
    capability: Option<f64>,
    /// Fraction of the capability promised to real-time streams.
    #[arg(long, default_value_t = 0.8)]
    rt_reserve: f64,
    /// Device reads in flight per component (the paper's adapter queue).
    #[arg(long, default_value_t = 4)]
    depth: usize,
    /// Registered buffers.
    #[arg(long, default_value_t = 256)]
    buffers: usize,
    /// Bytes per buffer (K, M suffixes).
    #[arg(long, default_value = "256K", value_parser = parse_size)]
    buffer_size: u64,
    /// Most HTTP connections.
    #[arg(long, default_value_t = 16384)]
    max_connections: usize,
    /// Run the engine thread at this SCHED_FIFO priority (1-99), below the upcalls that
    /// pace the streams, so timesharing load does not delay their sends; 0 for
    /// timesharing. If refused, serve anyway and say so.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=99))]
    fifo: u8,
    /// Least time of stream a paced stream keeps read ahead, in milliseconds (it reads
    /// further ahead when the devices' measured latency asks for it).
    #[arg(long, default_value_t = 500)]
    min_readahead_ms: u64,
    /// Do not register with the name server (HTTP only, no streams API).
    #[arg(long)]
    no_ports: bool,
    /// The name server's socket [default: as for `ictus name-server`].
    #[arg(long)]
    name_server: Option<PathBuf>,
    /// The control socket [default: mars-control.sock beside the name server's].
    #[arg(long)]
    control_socket: Option<PathBuf>,
}

/// Parses `64K`, `1M`, `2G` or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok().and_then(|n| n.checked_mul(mul)).ok_or_else(|| format!("bad size {s:?}"))
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
            let v = Volume::create(&components, interleave, size)?;
            print!("{}", v.describe());
        }
        VolumeCommand::Add { volume, name, file, hls_target } => {
            let mut v = Volume::open(&volume)?;
            let pl = v.add_file(&name, &file, hls_target)?;
            println!("added {name}");
            if let Some(pl) = pl {
                println!("added {pl} (HLS playlist with byte ranges)");
            }
        }
        VolumeCommand::Info { components } => print!("{}", Volume::open(&components)?.describe()),
        VolumeCommand::Bench { components, depth, seconds } => {
            let s = crate::LocalStorage::open(&components)?;
            let rate = crate::measure::capability(&s, depth, Duration::from_secs_f64(seconds.clamp(0.1, 600.0)))?;
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
    let engine = EngineConfig {
        device_depth: a.depth.max(1),
        buffers: a.buffers,
        buf_size: a.buffer_size as usize,
        max_connections: a.max_connections,
        rt_reserve: a.rt_reserve,
        fifo: (a.fifo > 0).then_some(a.fifo),
        readahead: ictus_mars::readahead::ReadAhead {
            floor_ns: a.min_readahead_ms.saturating_mul(1_000_000),
            ..ictus_mars::readahead::ReadAhead::default()
        },
        ..EngineConfig::default()
    };
    raise_nofile();
    let running = crate::start(&StartOptions {
        volume: a.volume,
        listen: Some(a.listen),
        capability: a.capability,
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

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("64K"), Ok(65536));
        assert_eq!(super::parse_size("2M"), Ok(2 << 20));
        assert_eq!(super::parse_size("123"), Ok(123));
        assert!(super::parse_size("x").is_err());
        assert!(super::parse_size("99999999999G").is_err());
    }
}
