//! Runs the `ipc` experiment outside the `ictus` binary, with the same options as
//! `ictus bench ipc` (the harness builds them from the experiment's declaration):
//! `cargo run --release -p ictus-experiments --example ipc_peers -- --quick [--json FILE]
//! [--pin C,S]`.

use std::process::ExitCode;

use ictus_experiments::ipc::IPC;

fn main() -> ExitCode {
    // Benchmark servers are this binary re-executed; they never return from here.
    ictus_bench::maybe_run_child(&[&IPC]);

    let matches = ictus_bench::cli::command(&IPC).get_matches();
    match ictus_bench::cli::invocation(&matches).and_then(|inv| ictus_bench::cli::run(&IPC, &inv)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipc: {e}");
            ExitCode::FAILURE
        }
    }
}
