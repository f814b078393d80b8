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
        /// The long-lived server's run socket [default: unix-server.sock in
        /// $XDG_RUNTIME_DIR/ictus, or /tmp/ictus-$EUID] (with --server only).
        #[arg(long, requires = "server")]
        socket: Option<PathBuf>,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        argv: Vec<OsString>,
    },
    /// The long-lived server's counts, in total and per program it serves (found
    /// through the name server).
    Stats {
        #[command(flatten)]
        server: Found,
    },
    /// The long-lived server's policy (found through the name server); with --set,
    /// replace it for programs started from now on (programs running keep theirs).
    Policy {
        #[command(flatten)]
        server: Found,
        /// The new policy file (see doc/unix.md); the server checks it first and
        /// refuses an invalid one, changing nothing. Only the server's user and root
        /// may.
        #[arg(long, value_name = "FILE")]
        set: Option<PathBuf>,
    },
}

/// Where the long-lived server is found.
#[derive(Args, Debug)]
struct Found {
    /// The name server's socket [default: as for `ictus name-server`].
    #[arg(long)]
    name_server: Option<PathBuf>,
    /// The name the server registered.
    #[arg(long, default_value = ictus_unix_server::control_api::SERVICE_NAME)]
    name: String,
}

impl Found {
    fn connect(&self) -> Result<ictus_unix_server::control_api::Control, Box<dyn std::error::Error>> {
        let space = ictus_ipc::Space::task();
        Ok(ictus_unix_server::control_api::Control::connect_as(&space, self.name_server.as_deref(), &self.name)?)
    }
}

/// `ictus unix-server`.
#[derive(Args, Debug)]
pub struct UnixServerArgs {
    /// The policy every program gets (see doc/unix.md) [default: the host's tree,
    /// network on].
    #[arg(long)]
    policy: Option<PathBuf>,
    /// The socket programs are started on (`ictus unix run --server`) [default:
    /// unix-server.sock in $XDG_RUNTIME_DIR/ictus, or /tmp/ictus-$EUID].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The name server's socket [default: as for `ictus name-server`].
    #[arg(long)]
    name_server: Option<PathBuf>,
    /// The name to register the control port under.
    #[arg(long, default_value = ictus_unix_server::control_api::SERVICE_NAME)]
    name: String,
}

/// Run `ictus unix-server` until `SIGINT` or `SIGTERM`.
pub fn server_main(a: UnixServerArgs) -> Result<(), Box<dyn std::error::Error>> {
    let opts = ictus_unix_server::daemon::ServeOptions {
        policy: a.policy,
        socket: a.socket,
        name_server: a.name_server,
        name: Some(a.name),
    };
    Ok(ictus_server::serve_until_signalled(|stop| ictus_unix_server::daemon::serve(&opts, stop))?)
}

fn print_counts(what: &str, c: &ictus_unix_server::control_api::Counts) {
    let refused: Vec<String> = c.refused.iter().map(|(n, k)| format!("{n} {k}")).collect();
    let n = &c.native;
    println!(
        "{what}: served {} requests on {} connections ({} open), {} malformed, refused [{}]; \
         {} read-only lookups by the library (opens {}, stat {}, statx {}, access {}, readlink {}, getcwd {})",
        c.served,
        c.connections,
        c.open,
        c.malformed,
        refused.join(", "),
        n.total(),
        n.opens,
        n.stat,
        n.statx,
        n.access,
        n.readlink,
        n.getcwd
    );
}

/// Run `ictus unix …`; `run` ends the process as the program ended.
/// `quiet` is the global `-q`: say nothing about privileges the kernel did not grant.
pub fn main(a: UnixArgs, quiet: bool) -> Result<(), Box<dyn std::error::Error>> {
    match a.command {
        UnixCommand::Stats { server } => {
            let control = server.connect()?;
            let s = control.stats()?;
            let programs = control.programs()?;
            println!(
                "server pid {} uid {}, policy {}, {} workers\nprograms running {}, started {}",
                s.pid, s.uid, s.policy, s.workers, s.programs_running, s.programs_started
            );
            print_counts("total", &s.total);
            for p in &programs {
                print_counts(
                    &format!("program {} (pid {}, policy {}) {}", p.id, p.pid, p.policy, p.argv.join(" ")),
                    &p.counts,
                );
            }
            Ok(())
        }
        UnixCommand::Policy { server, set: None } => {
            let (number, text) = server.connect()?.policy()?;
            println!("# policy {number}");
            if text.trim().is_empty() {
                println!("# (the default: the host's tree, network on)");
            }
            print!("{text}");
            if !text.is_empty() && !text.ends_with('\n') {
                println!();
            }
            Ok(())
        }
        UnixCommand::Policy { server, set: Some(file) } => {
            let text = std::fs::read_to_string(&file).map_err(|e| format!("reading {}: {e}", file.display()))?;
            use ictus_unix_server::control_api::PolicyChange;
            match server.connect()?.set_policy(&text)? {
                PolicyChange::Installed(n) => {
                    println!("policy {n} in force for programs started from now on; programs running keep theirs");
                    Ok(())
                }
                PolicyChange::Invalid(why) => {
                    Err(format!("the Unix server refused {}: {why}; its policy is unchanged", file.display()).into())
                }
            }
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
            let b = snap.generation_bumps;
            eprintln!(
                "ictus unix: kept failures: {} walked by the server; every one made stale {} times (changes served \
                 {}, watched directories {}, timer {}, mounts {}); {} name buckets bumped",
                snap.failure_walks,
                b.total(),
                b.served,
                b.watch,
                b.timer,
                b.mounts,
                snap.name_bumps
            );
            ictus_unix_server::exit_like(ended)
        }
    }
}
