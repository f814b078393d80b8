//! Running the other end of a measurement in a separate process.
//!
//! The paper measured between processes, so servers run in their own process: the
//! harness re-executes the current binary as `exe __bench-child <role> <args…>`, and
//! that binary's `main` hands control to [`maybe_run_child`], which runs the role and
//! exits. Re-executing (rather than only forking) gives the server a clean,
//! single-threaded process image, as a real server would have.
//!
//! Roles are [`Role`] values: the harness's own ([`crate::experiment::harness_roles`])
//! and those each experiment of the registry declares. A child never outlives the
//! benchmark: it gets `SIGKILL` when its parent dies (`PR_SET_PDEATHSIG`), and each role
//! also exits on end-of-file of its channel.

use std::ffi::OsString;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::Signal;

use crate::experiment::{find_role, Experiment, Role};
use crate::sys::GuardedCommand;

/// The first argument that marks a re-executed benchmark child.
pub const CHILD_FLAG: &str = "__bench-child";

/// The command that runs `role` with `args` in a child process: this binary
/// re-executed, standard input from `/dev/null`, standard output and error inherited,
/// killed if the spawning *thread* exits (that is how `PR_SET_PDEATHSIG` works, so spawn
/// from a thread that lives as long as the measurement).
///
/// `inherit` stay open in the child under the same numbers; pass the numbers in `args`
/// and take them in the child with [`fd_arg`].
pub fn child_command<'fd>(
    role: &Role,
    args: &[String],
    inherit: &[BorrowedFd<'fd>],
) -> io::Result<GuardedCommand<'fd>> {
    let exe = std::env::current_exe()?;
    let mut command = GuardedCommand::new(exe, Signal::KILL).inherit(inherit).check_parent();
    command.command().arg(CHILD_FLAG).arg(role.name).args(args);
    Ok(command)
}

/// Spawns `role` with `args` (see [`child_command`]).
pub fn spawn_child(role: &Role, args: &[String], inherit: &[BorrowedFd]) -> io::Result<Child> {
    child_command(role, args, inherit)?.spawn()
}

/// As [`spawn_child`], with standard output piped to the parent.
pub fn spawn_child_piped(role: &Role, args: &[String], inherit: &[BorrowedFd]) -> io::Result<Child> {
    let mut command = child_command(role, args, inherit)?;
    command.command().stdout(Stdio::piped());
    command.spawn()
}

/// Runs a benchmark child role and exits if this process was started as one; returns
/// at once otherwise. Call it first thing in `main` of any binary that runs
/// experiments, with the registry whose roles it may be asked to run.
pub fn maybe_run_child(registry: &[&Experiment]) {
    let mut argv = std::env::args_os().skip(1);
    if argv.next().as_deref() != Some(std::ffi::OsStr::new(CHILD_FLAG)) {
        return;
    }
    let args: Option<Vec<String>> = argv.map(OsString::into_string).map(Result::ok).collect();
    let code = match args.as_deref() {
        Some([role, rest @ ..]) => run_role(registry, role, rest),
        _ => {
            eprintln!("{CHILD_FLAG}: expected a role name and UTF-8 arguments");
            2
        }
    };
    std::process::exit(code);
}

/// Runs the named role; status 2 if neither the harness nor `registry` has it.
pub fn run_role(registry: &[&Experiment], role: &str, args: &[String]) -> i32 {
    match find_role(registry, role) {
        Some(r) => (r.run)(args),
        None => {
            eprintln!("{CHILD_FLAG}: unknown role {role:?}");
            2
        }
    }
}

/// Takes ownership of a descriptor inherited from the parent, given as a decimal
/// argument. Fails unless the argument names an open descriptor above the standard
/// three. Call it at most once per descriptor.
pub fn fd_arg(arg: &str) -> io::Result<OwnedFd> {
    let fd: RawFd = arg.parse().map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("bad fd {arg:?}")))?;
    crate::sys::take_inherited_fd(fd)
}

/// Parses a numeric argument of a child role.
pub fn num_arg(args: &[String], index: usize, what: &str) -> io::Result<usize> {
    args.get(index)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("missing or bad {what}")))
}

/// The exit status of a role's `main`: 0 on success, else the error on standard error
/// (prefixed with the role's name) and 1.
pub fn role_status<E: std::fmt::Display>(role: &str, result: Result<(), E>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{role}: {e}");
            1
        }
    }
}

/// Waits for a child that was told to exit (its channel closed), killing it if it has
/// not exited within `grace`. Errors are ignored: this is for `Drop`.
pub fn reap(child: &mut Child, grace: Duration) {
    let _ = reap_status(child, grace);
}

/// As [`reap`], returning the child's exit status (a killed child's shows the signal).
/// Safe to call again: a reaped child's status is remembered.
pub fn reap_status(child: &mut Child, grace: Duration) -> io::Result<ExitStatus> {
    let deadline = Instant::now() + grace;
    loop {
        match child.try_wait()? {
            Some(status) => return Ok(status),
            None if Instant::now() >= deadline => {
                child.kill()?;
                return child.wait();
            }
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::tests::REGISTRY;

    #[test]
    fn unknown_role_fails() {
        assert_eq!(run_role(REGISTRY, "no-such-role", &[]), 2);
        assert_eq!(run_role(REGISTRY, "echo", &[]), 0);
    }

    #[test]
    fn fd_arg_refuses_bad_descriptors() {
        assert!(fd_arg("x").is_err());
        assert!(fd_arg("1").is_err());
        assert!(fd_arg("1000000").is_err());
    }

    #[test]
    fn num_arg_parses() {
        let args = vec!["12".to_string(), "x".to_string()];
        assert_eq!(num_arg(&args, 0, "n").expect("12"), 12);
        assert!(num_arg(&args, 1, "n").is_err());
        assert!(num_arg(&args, 2, "n").is_err());
    }
}
