//! `ictus`: the servers, the tools and the experiments of the ictus system.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// ictus: a Mach-style microkernel personality in user space on Linux.
///
/// Tasks talk through ports whose rights the kernel enforces; services are server
/// processes; the papers' experiments run beside today's peers.
#[derive(Parser, Debug)]
#[command(name = "ictus", version, propagate_version = true)]
struct Cli {
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
        #[arg(long, num_args = 1..)]
        only: Vec<String>,
    },
    /// Run one experiment and print its table (and write its JSON with --json).
    Bench {
        /// List the experiments, one per line, and exit.
        #[arg(long, exclusive = true)]
        list: bool,
        #[command(subcommand)]
        experiment: Option<Experiment>,
    },
}

#[derive(Subcommand, Debug)]
enum Experiment {
    /// Transfer costs (000 §8, Figure 3): port round trips in-line and out-of-line
    /// from 1 B to 16 MiB beside socketpair, pipe and futex peers, and memcpy.
    Ipc(BenchArgs),
    /// File read methods (000 Table 2): stdio-style, block, mapped, mapio, O_DIRECT and
    /// io_uring reads, cached and uncached.
    Fileread(BenchArgs),
}

impl Experiment {
    /// Every experiment, as `ictus bench NAME` spells it.
    const NAMES: &'static [&'static str] = &["ipc", "fileread"];
}

#[derive(clap::Args, Debug)]
struct BenchArgs {
    /// Seconds, not minutes: fewer sizes' iterations, for smoke tests.
    #[arg(long)]
    quick: bool,
    /// Write the result as one JSON object to this file (and plots beside it).
    #[arg(long)]
    json: Option<PathBuf>,
    /// CPU placement: `C` puts client and servers on CPU C (the papers' machines had
    /// one CPU), `C,S` the client on C and the servers on S, `none` lets the scheduler
    /// choose (on a VM, where it places them changes small round trips several-fold).
    #[arg(long, default_value = "0")]
    pin: String,
    /// Print progress to standard error.
    #[arg(long)]
    progress: bool,
}

impl BenchArgs {
    fn pin(&self) -> Result<Option<ictus_bench::pin::PinPlan>, ictus_bench::BenchError> {
        if self.pin == "none" {
            return Ok(None);
        }
        ictus_bench::pin::PinPlan::parse(&self.pin).map(Some)
    }
}

fn bench_ipc(a: BenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    let opts =
        ictus_bench::ipc::IpcOptions { quick: a.quick, json: a.json.clone(), pin: a.pin()?, progress: a.progress };
    let report = ictus_bench::ipc::run(&opts)?;
    report.print_table();
    Ok(())
}

fn main() -> ExitCode {
    // Experiments run their peers as child processes of this same binary.
    ictus_bench::maybe_run_child();
    let cli = Cli::parse();
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::NameServer { socket } => ictus_name_server::cli::serve(socket).map_err(Into::into),
        Command::Names { socket, json } => ictus_name_server::cli::list(socket, json).map_err(Into::into),
        Command::Testbed { quick, out, only } => {
            ictus_bench::testbed::main(&ictus_bench::testbed::TestbedOptions { quick, out, only }).map_err(Into::into)
        }
        Command::Bench { list: true, .. } => {
            for e in Experiment::NAMES {
                println!("{e}");
            }
            Ok(())
        }
        Command::Bench { experiment: None, .. } => Err("name an experiment (see `ictus bench --list`)".into()),
        Command::Bench { experiment: Some(e), .. } => match e {
            Experiment::Ipc(a) => bench_ipc(a),
            Experiment::Fileread(a) => ictus_bench::fileread::main(a.quick, a.json).map_err(Into::into),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ictus: {e}");
            ExitCode::FAILURE
        }
    }
}
