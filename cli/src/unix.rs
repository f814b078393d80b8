//! `ictus unix …`: Unix as an application (004). `run` starts a program under a
//! private Unix server whose policy the user writes.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Subcommand};

/// `ictus unix`.
#[derive(Args, Debug)]
pub struct UnixArgs {
    #[command(subcommand)]
    command: UnixCommand,
}

#[derive(Subcommand, Debug)]
enum UnixCommand {
    /// Run a program with its system calls served by a private Unix server: the view
    /// of files, the network and the refused calls come from the policy. Exit code,
    /// ending signal and standard streams are the program's.
    Run {
        /// The policy file (see doc/unix.md) [default: the host's tree, network on].
        #[arg(long)]
        policy: Option<PathBuf>,
        /// Say nothing about privileges the kernel did not grant.
        #[arg(long)]
        quiet: bool,
        /// Print the server's counts (requests served, refused by call, connections)
        /// on standard error when the program ends.
        #[arg(long)]
        stats: bool,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        argv: Vec<OsString>,
    },
}

/// Run `ictus unix …`; `run` ends the process as the program ended.
pub fn main(a: UnixArgs) -> Result<(), Box<dyn std::error::Error>> {
    match a.command {
        UnixCommand::Run { policy, quiet, stats, argv } => {
            let (ended, snap) =
                ictus_unix_server::run_session(&ictus_unix_server::RunOptions { policy, argv, quiet, stdout: None })?;
            if stats {
                eprintln!(
                    "ictus unix: served {} requests on {} connections ({} still open), {} malformed, refused {:?}",
                    snap.served, snap.connections, snap.open, snap.malformed, snap.refused
                );
            }
            ictus_unix_server::exit_like(ended)
        }
    }
}
