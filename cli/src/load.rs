//! `ictus load cpu|disk|net|mem`: run a background load for the "under load" columns.

use std::path::PathBuf;

use ictus_args::{Count, Seconds};
use ictus_bench::load::{run_with, LoadConfig, LoadKind, MAX_DURATION, MAX_THREADS};

/// Arguments of `ictus load`.
#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// cpu (busy loops on every CPU), disk (write, fdatasync, drop cache, read back),
    /// net (loopback TCP streams) or mem (page faults and memcpy over RAM/8, ≤ 2 GiB).
    pub kind: LoadKind,
    /// How long to run, in seconds (1 to 3600).
    #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = ictus_args::seconds(1.0, MAX_DURATION.as_secs_f64()))]
    pub seconds: Seconds,
    /// Threads (streams for net) (1 to 256) [default: per kind, see `doc/load.md`].
    #[arg(long, value_name = "N", value_parser = ictus_args::count(1, MAX_THREADS as u64))]
    pub threads: Option<Count>,
    /// Directory for the disk load's (unnamed) files [default: /var/tmp]; disk only.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

impl LoadArgs {
    /// Why these arguments contradict each other, if they do.
    pub fn contradiction(&self) -> Option<String> {
        (self.dir.is_some() && self.kind != LoadKind::Disk)
            .then(|| format!("--dir is where the disk load writes; the {} load writes no file", self.kind))
    }
}

/// Runs the load in this process and prints what it did.
pub fn main(a: LoadArgs) -> Result<(), Box<dyn std::error::Error>> {
    let duration = a.seconds.get();
    eprintln!("ictus load {}: {} s (Ctrl-C to stop)", a.kind, duration.as_secs_f64());
    let summary = run_with(a.kind, duration, &LoadConfig { threads: a.threads.map(Count::as_usize), dir: a.dir })?;
    println!("{summary}");
    Ok(())
}
