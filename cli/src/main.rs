//! `ictus`: the servers, the tools and the experiments of the ictus system.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod load;
mod midi;
mod unix;

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
        /// Serve at this SCHED_FIFO priority (1-99); if refused, serve anyway and say so.
        #[arg(long, value_parser = clap::value_parser!(u8).range(1..=99))]
        fifo: Option<u8>,
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
        #[arg(long, num_args = 1..)]
        only: Vec<String>,
    },
    /// Run a background load for a while (cpu, disk, net or mem), for experiments under load.
    Load(load::LoadArgs),
    /// MIDI: decode captures, play and conduct Standard MIDI Files, make the demo file.
    Midi(midi::MidiArgs),
    /// Unix as an application (004): run a program under a user-level Unix server.
    Unix(unix::UnixArgs),
    /// A long-lived Unix server for several programs at once (`ictus unix run --server`),
    /// with a control socket for its counts and policy (`ictus unix stats|policy`).
    UnixServer(unix::UnixServerArgs),
    /// Run the MIDI input server (000 §4.5): read a device (the virtual cable by default),
    /// send each message to the clients subscribed to its class; registered as "midi_inputport".
    MidiServer(ictus_midi_server::cli::ServerArgs),
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
enum ClockQuery {
    /// The time since boot and the wall time.
    Now,
    /// The server's counters (needs the control port).
    Stats,
    /// Set the alarm resolution in microseconds, 0 for exact (needs the control port).
    SetResolution {
        /// Microseconds.
        us: u64,
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
    /// Wake-up lateness (000 §3.1, §5): in-process sleep-until, clock-server alarm messages
    /// and upcalls at 100 Hz and 1 kHz, timesharing and fixed priority, under loads, beside
    /// cyclictest in the same window.
    Alarm(BenchArgs),
    /// Timer overhead (000 §6): a background loop's work lost to a timer waking a thread
    /// at 100 Hz, 1 kHz and 10 kHz (clock_nanosleep and upcalls beside timerfd).
    TimerOverhead(BenchArgs),
    /// Periodic streams (001 Table 3): three upcalls of 60, 75 and 120 ms doing stream work,
    /// with and without CPU load, counting deadline misses, beside timesharing threads.
    Rtu(BenchArgs),
    /// Real-time IPC message cost (003 §5.1): round trips through real-time ports under
    /// FIFO/OFF, PRIO/OFF, PRIO/ON and BPI/ON beside a plain port, several sizes.
    Rtipc(BenchArgs),
    /// Distributed Hartstone (003 Table 2): breakdown utilization of DHScl and DHSpq on one
    /// CPU for plain ports, FIFO/OFF, PRIO/ON and BPI/ON.
    Dhs(BenchArgs),
    /// Shared-memory channels (002 §3, 000 §8.4): 64 B round trips spinning and blocking,
    /// small-record throughput, wake-ups per message with 8 clients, frames through loans,
    /// beside iceoryx2, a raw futex ping-pong and ictus ports.
    Shm(BenchArgs),
    /// MIDI latency under load (000 Table 1, Figure 1): 100 messages/s through the output
    /// library onto the virtual cable, timesharing / fixed priority / deadline, under loads,
    /// beside cyclictest in the same window.
    Midi(BenchArgs),
    /// Unix as an application (004 §5): the operation table, the compile test and the
    /// modified Andrew benchmark, native, under ictus and under proot, interleaved.
    Unix(BenchArgs),
}

impl Experiment {
    /// Every experiment, as `ictus bench NAME` spells it.
    const NAMES: &'static [&'static str] =
        &["ipc", "fileread", "alarm", "timer-overhead", "rtu", "rtipc", "dhs", "shm", "midi", "unix"];
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
        Command::ClockServer { name_server, control_socket, name, fifo } => {
            ictus_clock_server::cli::serve(ictus_clock_server::cli::ServeOptions {
                name_server,
                control_socket,
                name: Some(name),
                fifo,
            })
            .map_err(Into::into)
        }
        Command::Clock { name_server, control_socket, query } => {
            let q = match query {
                ClockQuery::Now => ictus_clock_server::cli::Query::Now,
                ClockQuery::Stats => ictus_clock_server::cli::Query::Stats,
                ClockQuery::SetResolution { us } => ictus_clock_server::cli::Query::SetResolution(us),
            };
            ictus_clock_server::cli::query(q, name_server, control_socket).map_err(Into::into)
        }
        Command::Names { socket, json } => ictus_name_server::cli::list(socket, json).map_err(Into::into),
        Command::Testbed { quick, out, only } => {
            ictus_bench::testbed::main(&ictus_bench::testbed::TestbedOptions { quick, out, only }).map_err(Into::into)
        }
        Command::Load(a) => load::main(a),
        Command::Midi(a) => midi::main(a),
        Command::Unix(a) => unix::main(a),
        Command::UnixServer(a) => unix::server_main(a),
        Command::MidiServer(a) => ictus_midi_server::cli::serve(a).map_err(Into::into),
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
            Experiment::Alarm(a) => ictus_bench::alarm::main(a.quick, a.json).map_err(Into::into),
            Experiment::TimerOverhead(a) => ictus_bench::timer_overhead::main(a.quick, a.json).map_err(Into::into),
            Experiment::Rtu(a) => ictus_bench::rtu::main(a.quick, a.json).map_err(Into::into),
            Experiment::Rtipc(a) => {
                a.pin().and_then(|pin| ictus_bench::rtipc::main(a.quick, a.json.clone(), pin)).map_err(Into::into)
            }
            Experiment::Dhs(a) => {
                a.pin().and_then(|pin| ictus_bench::dhs::main(a.quick, a.json.clone(), pin)).map_err(Into::into)
            }
            Experiment::Shm(a) => ictus_bench::shm::main(a.quick, a.json).map_err(Into::into),
            Experiment::Midi(a) => ictus_bench::midi::main(a.quick, a.json).map_err(Into::into),
            Experiment::Unix(a) => ictus_unix_server::bench::main(a.quick, a.json).map_err(Into::into),
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
