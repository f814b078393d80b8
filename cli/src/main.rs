//! `ictus`: the servers, the tools and the experiments of the ictus system.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Subcommand};
use ictus_args::{Micros, Priority};
use ictus_bench::experiment::{self, Experiment};
use ictus_experiments as experiments;

mod display;
#[cfg(test)]
mod hostile;
mod load;
mod midi;
mod tactus;
mod unix;

/// ictus: a Mach-style microkernel personality in user space on Linux.
///
/// Tasks talk through ports whose rights the kernel enforces; services are server
/// processes; the papers' experiments run beside today's peers.
#[derive(clap::Parser, Debug)]
#[command(name = "ictus", version, propagate_version = true)]
struct Cli {
    /// Log more: -v adds the events' fields and debug events, -vv trace events
    /// (RUST_LOG, when set, chooses instead; ICTUS_LOG_FORMAT=json writes JSON).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Log less: -q only warnings and errors, -qq only errors.
    #[arg(short, long, action = clap::ArgAction::Count, global = true, conflicts_with = "verbose")]
    quiet: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the name server: register send rights under names, look them up.
    NameServer {
        /// The well-known socket to listen on [default: $XDG_RUNTIME_DIR/ictus/name-server.sock,
        /// or /tmp/ictus-$UID/name-server.sock without XDG_RUNTIME_DIR].
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Run the clock server (000 §3.1): time, sleeps and alarm messages on the clock port
    /// (registered with the name server as "clock"); resolution and quotas on the
    /// clock-control port, handed only to this user and root on the control socket.
    ClockServer {
        /// The name server's socket [default: as for `ictus name-server`].
        #[arg(long)]
        name_server: Option<PathBuf>,
        /// The control socket [default: clock-control.sock beside the name server's socket].
        #[arg(long)]
        control_socket: Option<PathBuf>,
        /// The name to register the clock port under.
        #[arg(long, default_value = "clock")]
        name: String,
        /// Serve at this SCHED_FIFO priority (1 to 99); if refused, serve anyway and say so.
        #[arg(long, value_name = "PRIORITY", value_parser = ictus_args::priority(1, 99))]
        fifo: Option<Priority>,
        /// Wake this many microseconds before each deadline and wait for it awake, so
        /// that alarms go out at their time (0 to 1000; default 100; 0 spends no CPU
        /// waiting; see doc/clock.md).
        #[arg(long, value_name = "US", value_parser = ictus_args::micros(0, 1000))]
        lead_us: Option<Micros>,
    },
    /// Ask the clock server: the time (clock port), or its counters or resolution (control port).
    Clock {
        /// The name server's socket [default: as for `ictus name-server`].
        #[arg(long)]
        name_server: Option<PathBuf>,
        /// The control socket [default: as for `ictus clock-server`].
        #[arg(long)]
        control_socket: Option<PathBuf>,
        #[command(subcommand)]
        query: ClockQuery,
    },
    /// List the names registered with the name server.
    Names {
        /// The name server's socket [default: as for `ictus name-server`].
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Print JSON instead of one name per line.
        #[arg(long)]
        json: bool,
    },
    /// Run every experiment this machine can run and write a report (Markdown, SVG, JSON).
    Testbed {
        /// Seconds per experiment instead of minutes.
        #[arg(long)]
        quick: bool,
        /// Where to write the report.
        #[arg(long, default_value = "report")]
        out: PathBuf,
        /// Run only these experiments (names as `ictus bench --list` prints them).
        #[arg(long, num_args = 1.., value_parser = experiment_names())]
        only: Vec<String>,
    },
    /// Run a background load for a while (cpu, disk, net or mem), for experiments under load.
    Load(load::LoadArgs),
    /// MIDI: decode captures, play and conduct Standard MIDI Files, make the demo file.
    Midi(midi::MidiArgs),
    /// Run the MIDI input server (000 §4.5): read a device (the virtual cable by default),
    /// send each message to the clients subscribed to its class; registered as "midi_inputport".
    MidiServer(ictus_midi_server::cli::ServerArgs),
    /// MARS (001): striped volumes and the stream server (HTTP, the streams API on ports).
    Mars(ictus_mars_server::cli::MarsArgs),
    /// Unix as an application (004): run a program under a user-level Unix server.
    Unix(unix::UnixArgs),
    /// A long-lived Unix server for several programs at once (`ictus unix run --server`),
    /// registered with the name server as "unix", its control port giving its counts,
    /// its programs and its policy (`ictus unix stats|policy`).
    UnixServer(unix::UnixServerArgs),
    /// The display server (002) and a demo client.
    Display(display::DisplayArgs),
    /// The Tactus media synchronization server (000 §7).
    Tactus(tactus::TactusArgs),
    /// Play a clip (video, audio, MIDI) through Tactus: disk → application → Tactus → devices.
    Play(tactus::PlayArgs),
    /// Run one experiment and print its table (and write its JSON with --json).
    Bench(BenchArgs),
    /// Print shell completions for `ictus` to standard output
    /// (e.g. `ictus completions bash > ~/.local/share/bash-completion/completions/ictus`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages of `ictus` and each of its subcommands (ictus.1, ictus-bench.1, …)
    /// into a directory, made if missing.
    Man {
        /// The directory.
        #[arg(long, default_value = "man")]
        out: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum ClockQuery {
    /// The time since boot and the wall time.
    Now,
    /// The server's counters (needs the control port).
    Stats,
    /// Set the alarm resolution in microseconds, 0 for exact (needs the control port).
    SetResolution {
        /// Microseconds (0 to 1000000).
        #[arg(value_parser = ictus_args::micros(0, MAX_RESOLUTION_US))]
        us: Micros,
    },
}

/// The coarsest alarm resolution the clock server takes, in microseconds.
const MAX_RESOLUTION_US: u64 = ictus_clock_server::protocol::MAX_RESOLUTION.as_micros() as u64;

impl ClockQuery {
    /// Whether the query goes to the control port (else to the clock port, found
    /// through the name server).
    fn uses_control_port(&self) -> bool {
        !matches!(self, ClockQuery::Now)
    }
}

/// `--only`'s values: the registry's names.
fn experiment_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(REGISTRY.iter().map(|e| e.name))
}

/// Every experiment `ictus bench` runs, in the order `ictus bench --list` prints them:
/// the one place experiments are registered. The command line, the testbed and the
/// child dispatcher all read it; an experiment from another crate (a server's) is one
/// more line here.
static REGISTRY: &[&Experiment] = &[
    &experiments::ipc::IPC,
    &experiments::fileread::FILEREAD,
    &experiments::alarm::ALARM,
    &experiments::timer_overhead::TIMER_OVERHEAD,
    &experiments::rtu::RTU,
    &experiments::rtipc::RTIPC,
    &experiments::dhs::DHS,
    &experiments::shm::SHM,
    &experiments::midi::MIDI,
    &ictus_mars_server::bench::MARS,
    &ictus_mars_server::cluster_bench::MARS_CLUSTER,
    &ictus_unix_server::bench::UNIX,
    &ictus_display_server::bench::DISPLAY,
    &ictus_tactus_server::bench::TACTUS,
];

/// `ictus bench [--list] [NAME [OPTIONS]]`: a subcommand per experiment of the
/// registry, built from its declaration ([`ictus_bench::cli::command`]).
#[derive(Debug)]
struct BenchArgs {
    list: bool,
    experiment: Option<(&'static Experiment, clap::ArgMatches)>,
}

impl clap::FromArgMatches for BenchArgs {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let experiment = match matches.subcommand() {
            Some((name, sub)) => match experiment::find(REGISTRY, name) {
                Some(e) => Some((e, sub.clone())),
                None => return Err(clap::Error::raw(clap::error::ErrorKind::InvalidSubcommand, name)),
            },
            None => None,
        };
        Ok(BenchArgs { list: matches.get_flag("list"), experiment })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for BenchArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd.arg(
            clap::Arg::new("list")
                .long("list")
                .action(clap::ArgAction::SetTrue)
                .help("List the experiments, one per line, and exit"),
        )
        .subcommands(REGISTRY.iter().map(|e| ictus_bench::cli::command(e)))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// What `ictus bench` was asked to do.
#[derive(Debug)]
enum BenchRequest {
    List,
    Run(&'static Experiment, clap::ArgMatches),
}

impl BenchArgs {
    /// The request, or the one line that says why the arguments make none.
    fn request(self) -> Result<BenchRequest, String> {
        match (self.list, self.experiment) {
            (true, None) => Ok(BenchRequest::List),
            (true, Some((e, _))) => Err(format!(
                "--list lists every experiment and takes no name: run `ictus bench --list` or `ictus bench {}`",
                e.name
            )),
            (false, Some((e, m))) => Ok(BenchRequest::Run(e, m)),
            (false, None) => Err("name an experiment (see `ictus bench --list`)".to_string()),
        }
    }
}

/// `ictus bench …`: exit status 2 for arguments that make no request.
fn bench(args: BenchArgs) -> u8 {
    let result = match args.request() {
        Ok(BenchRequest::List) => {
            print!("{}", ictus_bench::cli::list(REGISTRY));
            Ok(())
        }
        Ok(BenchRequest::Run(e, matches)) => {
            ictus_bench::cli::invocation(&matches).and_then(|inv| ictus_bench::cli::run(e, &inv))
        }
        Err(usage) => {
            eprintln!("ictus bench: {usage}");
            return 2;
        }
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ictus: {e}");
            1
        }
    }
}

/// Why the arguments, each valid, contradict each other: one line, before anything
/// starts.
fn contradiction(cli: &Cli) -> Option<String> {
    match &cli.command {
        Command::Clock { control_socket: Some(_), query, .. } if !query.uses_control_port() => {
            Some("ictus clock now asks the clock port through the name server; --control-socket is for stats and set-resolution".into())
        }
        Command::Clock { name_server: Some(_), query, .. } if query.uses_control_port() => Some(
            "ictus clock stats and set-resolution use the control socket (--control-socket); --name-server is for now"
                .into(),
        ),
        Command::Load(a) => a.contradiction().map(|why| format!("ictus load: {why}")),
        _ => None,
    }
}

/// The whole command line, as the binary parses it: numbers checked by kind, and `-1`
/// taken as a (refused) value rather than a flag ([`ictus_args::harden`]).
fn command() -> clap::Command {
    ictus_args::harden(Cli::command())
}

/// Runs the command line `args` (the program's name first); the exit status: 2 for
/// arguments that make no request (one line on standard error, nothing started).
fn run(args: impl IntoIterator<Item = std::ffi::OsString>) -> u8 {
    let cli = match command().try_get_matches_from(args).and_then(|m| Cli::from_arg_matches(&m)) {
        Ok(cli) => cli,
        Err(e) => return ictus_args::report_error(&e),
    };
    if let Some(why) = contradiction(&cli) {
        eprintln!("error: {why}");
        return 2;
    }
    let verbosity = i8::try_from(cli.verbose).unwrap_or(i8::MAX) - i8::try_from(cli.quiet).unwrap_or(i8::MAX);
    ictus_server::log::init(verbosity);
    let quiet = cli.quiet > 0;
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::NameServer { socket } => ictus_name_server::cli::serve(socket).map_err(Into::into),
        Command::ClockServer { name_server, control_socket, name, fifo, lead_us } => {
            ictus_clock_server::cli::serve(ictus_clock_server::cli::ServeOptions {
                name_server,
                control_socket,
                name: Some(name),
                fifo: fifo.map(Priority::get),
                lead: lead_us.map(Micros::get),
            })
            .map_err(Into::into)
        }
        Command::Clock { name_server, control_socket, query } => {
            let q = match query {
                ClockQuery::Now => ictus_clock_server::cli::Query::Now,
                ClockQuery::Stats => ictus_clock_server::cli::Query::Stats,
                ClockQuery::SetResolution { us } => {
                    // In range (at most a second), so whole microseconds fit.
                    ictus_clock_server::cli::Query::SetResolution(us.get().as_micros() as u64)
                }
            };
            ictus_clock_server::cli::query(q, name_server, control_socket).map_err(Into::into)
        }
        Command::Names { socket, json } => ictus_name_server::cli::list(socket, json).map_err(Into::into),
        Command::Testbed { quick, out, only } => {
            ictus_bench::testbed::main(&ictus_bench::testbed::TestbedOptions { quick, out, only }, REGISTRY)
                .map_err(Into::into)
        }
        Command::Load(a) => load::main(a),
        Command::Midi(a) => midi::main(a),
        Command::MidiServer(a) => ictus_midi_server::cli::serve(a).map_err(Into::into),
        Command::Mars(a) => ictus_mars_server::cli::main(a),
        Command::Unix(a) => unix::main(a, quiet),
        Command::UnixServer(a) => unix::server_main(a),
        Command::Display(a) => display::main(a),
        Command::Tactus(a) => tactus::main(a),
        Command::Play(a) => tactus::play(a, quiet),
        Command::Bench(args) => return bench(args),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut command(), "ictus", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { out } => man_pages(&out).map_err(Into::into),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ictus: {e}");
            1
        }
    }
}

fn main() -> ExitCode {
    // Experiments run their peers as child processes of this same binary.
    ictus_bench::maybe_run_child(REGISTRY);
    ExitCode::from(run(std::env::args_os()))
}

/// `ictus man`: the pages of the whole command line, from its definition.
fn man_pages(out: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    clap_mangen::generate_to(command(), out)
        .map_err(|e| std::io::Error::new(e.kind(), format!("writing man pages into {}: {e}", out.display())))
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

    use super::*;

    #[test]
    fn completions_name_every_subcommand() {
        for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut command(), "ictus", &mut out);
            let text = String::from_utf8(out).expect("UTF-8");
            for sub in command().get_subcommands() {
                assert!(text.contains(sub.get_name()), "{shell}: no {}", sub.get_name());
            }
        }
    }

    #[test]
    fn man_pages_for_the_command_and_each_subcommand() {
        let dir = std::env::temp_dir().join(format!("ictus-man-{}", std::process::id()));
        man_pages(&dir).expect("ictus man");
        for sub in command().get_subcommands().map(|c| c.get_name().to_owned()).chain(["".to_owned()]) {
            let page = if sub.is_empty() { "ictus.1".to_owned() } else { format!("ictus-{sub}.1") };
            let text = std::fs::read_to_string(dir.join(&page)).unwrap_or_else(|e| panic!("{page}: {e}"));
            assert!(text.starts_with(".ie") || text.contains(".TH"), "{page} is a man page");
        }
        std::fs::remove_dir_all(&dir).expect("remove the pages");
    }

    #[test]
    fn the_registry_is_well_formed() {
        experiment::check_registry(REGISTRY).unwrap_or_else(|e| panic!("{e}"));
        Cli::command().debug_assert();
        command().debug_assert();
    }

    #[test]
    fn every_experiment_is_a_subcommand_in_the_registrys_order() {
        let cmd = Cli::command();
        let bench = cmd.find_subcommand("bench").expect("bench");
        let names: Vec<&str> = bench.get_subcommands().map(|c| c.get_name()).collect();
        let registered: Vec<&str> = REGISTRY.iter().map(|e| e.name).collect();
        assert_eq!(names, registered);
        assert_eq!(
            registered,
            [
                "ipc",
                "fileread",
                "alarm",
                "timer-overhead",
                "rtu",
                "rtipc",
                "dhs",
                "shm",
                "midi",
                "mars",
                "mars-cluster",
                "unix",
                "display",
                "tactus"
            ],
            "names are stable: CI and the testbed use them"
        );
    }

    fn request(args: &[&str]) -> Result<BenchRequest, String> {
        let matches = Cli::command().try_get_matches_from(args).map_err(|e| e.to_string())?;
        match Cli::from_arg_matches(&matches).map_err(|e| e.to_string())?.command {
            Command::Bench(b) => b.request(),
            other => Err(format!("not bench: {other:?}")),
        }
    }

    #[test]
    fn contradictory_bench_arguments_are_refused() {
        assert!(matches!(request(&["ictus", "bench", "--list"]), Ok(BenchRequest::List)));
        let err = request(&["ictus", "bench", "--list", "ipc"]).expect_err("contradictory");
        assert!(err.contains("--list") && err.contains("ipc") && !err.contains('\n'), "{err}");
        assert!(request(&["ictus", "bench"]).is_err());
        assert!(request(&["ictus", "bench", "nope"]).is_err(), "an unknown experiment");
        match request(&["ictus", "bench", "ipc", "--quick"]) {
            Ok(BenchRequest::Run(e, m)) => {
                assert_eq!(e.name, "ipc");
                assert!(m.get_flag("quick"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(request(&["ictus", "bench", "fileread", "--dir", "/x"]), Ok(BenchRequest::Run(..))));
        assert!(request(&["ictus", "bench", "ipc", "--dir", "/x"]).is_err(), "--dir is fileread's own");
    }
}
