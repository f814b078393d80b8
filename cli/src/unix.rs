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
        /// Print the server's counts (requests served, refused by call, connections)
        /// on standard error when the program ends (private server only: the
        /// long-lived server's are `ictus unix stats`).
        #[arg(long, conflicts_with = "server")]
        stats: bool,
        /// Run under the long-lived `ictus unix-server` instead of a private server
        /// (its policy applies; --policy is refused).
        #[arg(long, conflicts_with = "policy")]
        server: bool,
        /// The long-lived server's control socket [default: unix-server.sock in
        /// $XDG_RUNTIME_DIR/ictus, or /tmp/ictus-$EUID] (with --server only).
        #[arg(long, requires = "server")]
        socket: Option<PathBuf>,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        argv: Vec<OsString>,
    },
    /// The long-lived server's counts: programs, connections, requests, refusals.
    Stats {
        /// The control socket [default: as for `run --server`].
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// The long-lived server's policy, as it read it.
    Policy {
        /// The control socket [default: as for `run --server`].
        #[arg(long)]
        socket: Option<PathBuf>,
    },
}

/// `ictus unix-server`.
#[derive(Args, Debug)]
pub struct UnixServerArgs {
    /// The policy every program gets (see doc/unix.md) [default: the host's tree,
    /// network on].
    #[arg(long)]
    policy: Option<PathBuf>,
    /// The control socket [default: unix-server.sock in $XDG_RUNTIME_DIR/ictus, or
    /// /tmp/ictus-$EUID].
    #[arg(long)]
    socket: Option<PathBuf>,
}

/// Run `ictus unix-server` until stopped.
pub fn server_main(a: UnixServerArgs) -> Result<(), Box<dyn std::error::Error>> {
    Ok(ictus_unix_server::daemon::serve(a.policy.as_deref(), a.socket.as_deref())?)
}

/// Run `ictus unix …`; `run` ends the process as the program ended.
/// `quiet` is the global `-q`: say nothing about privileges the kernel did not grant.
pub fn main(a: UnixArgs, quiet: bool) -> Result<(), Box<dyn std::error::Error>> {
    match a.command {
        UnixCommand::Stats { socket } => {
            print!("{}", ictus_unix_server::daemon::query(socket.as_deref(), "STATS")?);
            Ok(())
        }
        UnixCommand::Policy { socket } => {
            print!("{}", ictus_unix_server::daemon::query(socket.as_deref(), "POLICY")?);
            Ok(())
        }
        UnixCommand::Run { server: true, socket, argv, .. } => {
            let opts = ictus_unix_server::RunOptions { policy: None, argv, quiet, stdout: None };
            let ended = ictus_unix_server::daemon::run_remote(socket.as_deref(), &opts)?;
            ictus_unix_server::exit_like(ended)
        }
        UnixCommand::Run { policy, stats, argv, .. } => {
            let opts = ictus_unix_server::RunOptions { policy, argv, quiet, stdout: None };
            if !stats {
                ictus_unix_server::exit_like(ictus_unix_server::run(&opts)?);
            }
            let (ended, snap) = ictus_unix_server::run_session(&opts)?;
            let [opens, stat, statx, access, readlink, getcwd] = snap.native_lookups;
            eprintln!(
                "ictus unix: served {} requests on {} connections ({} still open), {} malformed, refused {:?}; \
                 {} read-only lookups done by the library without the server (opens {opens}, stat {stat}, \
                 statx {statx}, access {access}, readlink {readlink}, getcwd {getcwd}; as the libraries report them)",
                snap.served,
                snap.connections,
                snap.open,
                snap.malformed,
                snap.refused,
                snap.native_total()
            );
            ictus_unix_server::exit_like(ended)
        }
    }
}
