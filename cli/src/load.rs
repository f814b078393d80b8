//! `ictus load cpu|disk|net|mem`: run a background load for the "under load" columns.

use std::path::PathBuf;
use std::time::Duration;

use ictus_bench::load::{run_with, LoadConfig, LoadKind, MAX_DURATION};

/// Arguments of `ictus load`.
#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// cpu (busy loops on every CPU), disk (write, fdatasync, drop cache, read back),
    /// net (loopback TCP streams) or mem (page faults and memcpy over RAM/8, ≤ 2 GiB).
    pub kind: LoadKind,
    /// How long to run, at most 3600.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Threads (streams for net) [default: per kind, see `doc/load.md`].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Directory for the disk load's (unnamed) files [default: /var/tmp].
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Runs the load in this process and prints what it did.
pub fn main(a: LoadArgs) -> Result<(), Box<dyn std::error::Error>> {
    let duration = Duration::from_secs(a.seconds);
    if duration > MAX_DURATION {
        return Err(format!("--seconds must be at most {}", MAX_DURATION.as_secs()).into());
    }
    eprintln!("ictus load {}: {} s (Ctrl-C to stop)", a.kind, a.seconds);
    let summary = run_with(a.kind, duration, &LoadConfig { threads: a.threads, dir: a.dir })?;
    println!("{summary}");
    Ok(())
}
