//! What `ictus midi-server` and `ictus midi monitor` do. The argument structs are
//! `clap::Args`, so the `ictus` binary embeds them as they are.

use std::path::PathBuf;
use std::time::Duration;

use ictus_args::{Count, Seconds};
use ictus_ipc::Space;
use ictus_midi::device::DeviceSpec;
use ictus_midi::Kind;
use ictus_server::{serve_until_signalled, Registrar};

use crate::monitor::{self, MonitorOptions, Source, Summary};
use crate::protocol::{MidiInputClient, SERVICE_NAME};
use crate::server::{Options, ServeError, Server};

/// `ictus midi-server`: the MIDI input server.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// The device to read: `cable:NAME` (the virtual cable), `/dev/snd/midiCxDy`,
    /// `serial:/dev/ttyX[,BAUD]`.
    #[arg(long, default_value = "cable:midi-in")]
    pub device: String,
    /// The name server's socket [default: as for `ictus name-server`].
    #[arg(long)]
    pub name_server: Option<PathBuf>,
    /// The name to register under.
    #[arg(long, default_value = SERVICE_NAME)]
    pub name: String,
    /// Do not ask for real-time priority for the driver and server threads.
    #[arg(long)]
    pub timesharing: bool,
    /// Print the counters of the server registered under --name as JSON, and exit.
    #[arg(long, conflicts_with_all = ["device", "timesharing"])]
    pub stats: bool,
}

/// Why `ictus midi-server` failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The device could not be opened.
    #[error(transparent)]
    Device(#[from] ictus_midi::device::OpenError),
    /// Serving failed.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The name server could not be reached.
    #[error("cannot find the MIDI input server: {0}")]
    NameServer(#[from] ictus_name_api::ConnectError),
    /// The name server refused the look-up.
    #[error("cannot look up {name:?} with the name server: {source}")]
    Lookup {
        /// The name.
        name: String,
        /// Why.
        source: ictus_name_api::ClientError,
    },
    /// The server did not answer.
    #[error("asking the MIDI input server failed: {0}")]
    Request(#[from] crate::client::RequestError),
    /// The monitor failed.
    #[error(transparent)]
    Monitor(#[from] monitor::MonitorError),
    /// A bad argument.
    #[error("{0}")]
    Usage(String),
}

/// `ictus midi-server`: open the device, register with the name server (again whenever
/// the name server restarts), serve until `SIGINT` or `SIGTERM` (or print a running
/// server's counters with `--stats`).
pub fn serve(args: ServerArgs) -> Result<(), CliError> {
    if args.stats {
        return print_stats(&args);
    }
    serve_until_signalled(|stop| {
        let spec = DeviceSpec::parse(&args.device)?;
        let device = spec.open_input()?;
        let space = Space::task();
        let options = if args.timesharing { Options::timesharing() } else { Options::default() };
        let mut server = Server::new(space.clone(), device, &options)?;
        let names = Registrar::start(
            "midi-server",
            args.name_server.as_deref(),
            &space,
            &[(&args.name, server.service_port())],
        )
        .map_err(ServeError::from)?;
        tracing::info!(
            server = "midi-server",
            device = %spec,
            name = %args.name,
            port = server.service_port().0,
            pid = std::process::id(),
            "reading {spec}, registered as {:?} (pid {})",
            args.name,
            std::process::id()
        );
        ictus_server::notify::ready("midi-server", &format!("reading {spec}, registered as {:?}", args.name));
        let result = server.run(stop);
        ictus_server::notify::stopping("midi-server");
        names.stop();
        let stats = server.stats();
        drop(server);
        tracing::info!(server = "midi-server", "stopped; {}", stats.to_json());
        Ok(result?)
    })
}

fn print_stats(args: &ServerArgs) -> Result<(), CliError> {
    let space = Space::task();
    let ns = match &args.name_server {
        Some(p) => ictus_name_api::Client::connect_socket(&space, p)?,
        None => ictus_name_api::Client::connect(&space)?,
    };
    let right = ns.lookup(&args.name).map_err(|source| CliError::Lookup { name: args.name.clone(), source })?;
    let stubs = MidiInputClient::new(&space, right).with_timeout(Duration::from_secs(10));
    let stats = stubs.stats()?;
    let device = stubs.device()?;
    let mut v = stats.to_json();
    v["device"] = device.into();
    println!("{v}");
    Ok(())
}

/// `ictus midi monitor`: the timing monitor.
#[derive(clap::Args, Debug, Clone)]
pub struct MonitorArgs {
    /// The device to listen to (`cable:NAME`, `/dev/snd/midiCxDy`, `serial:…`).
    #[arg(long, default_value = "cable:midi-monitor", conflicts_with = "server")]
    pub device: String,
    /// Listen through the MIDI input server (its timestamps) instead of a device.
    #[arg(long)]
    pub server: bool,
    /// With --server: the name it is registered under.
    #[arg(long, default_value = SERVICE_NAME, requires = "server")]
    pub name: String,
    /// With --server: the name server's socket.
    #[arg(long, requires = "server")]
    pub name_server: Option<PathBuf>,
    /// Stop after this many intervals (1 to 18446744073709551615).
    #[arg(long, value_name = "N", value_parser = ictus_args::count(1, u64::MAX))]
    pub count: Option<Count>,
    /// Stop after this many seconds (0.001 to 604800, a week).
    #[arg(long, value_name = "SECONDS", value_parser = ictus_args::seconds(0.001, 604_800.0))]
    pub duration: Option<Seconds>,
    /// Rows of the plot, one millisecond each (1 to 10000).
    #[arg(long, value_name = "N", default_value = "20", value_parser = ictus_args::count(1, 10_000))]
    pub rows: Count,
    /// Columns of the plot (1 to 100000) [default: the terminal's width].
    #[arg(long, value_name = "N", value_parser = ictus_args::count(1, 100_000))]
    pub columns: Option<Count>,
    /// Only these kinds of message (`note_on`, `clock`, …; repeatable) [default: all
    /// but active sensing].
    #[arg(long = "kind")]
    pub kinds: Vec<String>,
    /// Write the plot (the paper's Figure 1) as SVG.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write the intervals and their summary as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Do not draw live, even on a terminal.
    #[arg(long)]
    pub no_live: bool,
}

/// `ictus midi monitor`: listen, draw, summarise.
pub fn monitor(args: MonitorArgs) -> Result<(), CliError> {
    let kinds = args
        .kinds
        .iter()
        .map(|k| Kind::from_name(k).ok_or_else(|| CliError::Usage(format!("unknown kind {k:?}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let source = if args.server {
        Source::Server { name_server: args.name_server.clone(), name: args.name.clone() }
    } else {
        Source::Device(DeviceSpec::parse(&args.device)?)
    };
    let opts = MonitorOptions {
        source,
        count: args.count.map(Count::get),
        duration: args.duration.map(Seconds::get),
        rows: args.rows.as_usize(),
        columns: args.columns.map(Count::as_usize),
        kinds,
        svg: args.svg.clone(),
        json: args.json.clone(),
        live: !args.no_live && monitor::stdout_is_terminal(),
    };
    let r = monitor::run(&opts)?;
    match Summary::of(&r.intervals) {
        Some(s) => println!(
            "{} messages, {} intervals: min {:.3} ms, p50 {:.3} ms, p99 {:.3} ms, worst case {:.3} ms",
            r.messages,
            s.count,
            s.min_ns as f64 / 1e6,
            s.p50_ns as f64 / 1e6,
            s.p99_ns as f64 / 1e6,
            s.max_ns as f64 / 1e6
        ),
        None => println!("{} messages, no intervals", r.messages),
    }
    Ok(())
}
