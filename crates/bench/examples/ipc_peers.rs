//! Runs the `ipc` experiment in quick mode with whatever transports exist and prints
//! the table: `cargo run --release -p ictus-bench --example ipc_peers [-- --full]
//! [--json FILE] [--pin C,S]`.

use std::path::PathBuf;
use std::process::ExitCode;

use ictus_bench::ipc::{self, IpcOptions};
use ictus_bench::pin::PinPlan;

fn main() -> ExitCode {
    // Benchmark servers are this binary re-executed; they never return from here.
    ictus_bench::maybe_run_child();

    let mut opts = IpcOptions { quick: true, progress: true, ..IpcOptions::default() };
    let usage = || {
        eprintln!("usage: ipc_peers [--full] [--json FILE] [--pin C,S]");
        ExitCode::from(2)
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--full" => opts.quick = false,
            "--json" => match args.next() {
                Some(path) => opts.json = Some(PathBuf::from(path)),
                None => return usage(),
            },
            "--pin" => match args.next().map(|spec| PinPlan::parse(&spec)) {
                Some(Ok(plan)) => opts.pin = Some(plan),
                Some(Err(e)) => {
                    eprintln!("{e}");
                    return ExitCode::from(2);
                }
                None => return usage(),
            },
            _ => return usage(),
        }
    }

    match ipc::run(&opts) {
        Ok(report) => {
            report.print_table();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ipc: {e}");
            ExitCode::FAILURE
        }
    }
}
