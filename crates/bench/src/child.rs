//! Running the other end of a measurement in a separate process.
//!
//! The paper measured between processes, so servers run in their own process: the
//! harness re-executes the current binary as `exe __bench-child <role> <args…>`, and
//! that binary's `main` hands control to [`maybe_run_child`], which runs the role from
//! [`ROLES`] and exits. Re-executing (rather than only forking) gives the server a
//! clean, single-threaded process image, as a real server would have.
//!
//! A child never outlives the benchmark: it gets `SIGKILL` when its parent dies
//! (`PR_SET_PDEATHSIG`), and each role also exits on end-of-file of its channel.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{getpid, getppid, set_parent_process_death_signal, Signal};

/// The first argument that marks a re-executed benchmark child.
pub const CHILD_FLAG: &str = "__bench-child";

/// A child role: gets the arguments after the role name, returns the exit status.
pub type RoleFn = fn(&[String]) -> i32;

/// Every role a benchmark child can run. A role must exit by itself on end-of-file of
/// its channel (or the equivalent for shared memory, see [`crate::peers`]).
pub static ROLES: &[(&str, RoleFn)] = &[
    ("seqpacket-echo", crate::peers::seqpacket_server),
    ("pipe-echo", crate::peers::pipe_server),
    ("futex-echo", crate::peers::futex_server),
    ("port-echo", crate::ports::port_server),
    ("shm-echo", crate::shm::shm_server),
    ("iceoryx2-echo", crate::shm::iceoryx2_server),
    ("port-burst", crate::shm::port_burst_server),
    ("load", crate::load::load_role),
    ("clock-server", crate::alarm::clock_server_role),
    ("rtipc-echo", crate::rtipc::rt_echo_server),
    ("midi-receiver", crate::midi::receiver_role),
];

/// Spawns `current_exe() __bench-child <role> <args…>`.
///
/// `inherit_fds` stay open in the child under the same numbers (their close-on-exec
/// flag is cleared in the child only, between fork and exec, so the parent's copies
/// and other concurrently spawned children are unaffected); pass the numbers in `args`
/// and take them in the child with [`fd_arg`]. Standard input is closed-to-null,
/// standard output and error are inherited.
///
/// The child is killed if the spawning *thread* exits (that is how `PR_SET_PDEATHSIG`
/// works), so spawn from a thread that lives as long as the measurement.
pub fn spawn_child(role: &str, args: &[String], inherit_fds: &[BorrowedFd]) -> io::Result<Child> {
    let exe = std::env::current_exe()?;
    let raw_fds: Vec<RawFd> = inherit_fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let parent = getpid();
    let mut command = Command::new(exe);
    command.arg(CHILD_FLAG).arg(role).args(args).stdin(Stdio::null());
    let pre_exec = move || -> io::Result<()> {
        // Only async-signal-safe work happens here (raw system calls, no allocation):
        // this runs in the forked child of a possibly multi-threaded parent.
        for &fd in &raw_fds {
            // SAFETY: `fd` was a live descriptor borrowed by the caller for the whole
            // spawn, and fork duplicated it into this child, so it is open here.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
        }
        set_parent_process_death_signal(Some(Signal::KILL))?;
        // If the parent died before the line above, the signal will never come.
        if getppid() != Some(parent) {
            return Err(io::Error::other("benchmark parent exited during spawn"));
        }
        Ok(())
    };
    // SAFETY: the closure only makes async-signal-safe system calls (fcntl, prctl,
    // getppid) on data captured before the fork, and allocates nothing.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, pre_exec);
    }
    command.spawn()
}

/// Runs a benchmark child role and exits if this process was started as one; returns
/// at once otherwise. Call it first thing in `main` of any binary that runs benchmarks.
pub fn maybe_run_child() {
    let mut argv = std::env::args_os().skip(1);
    if argv.next().as_deref() != Some(std::ffi::OsStr::new(CHILD_FLAG)) {
        return;
    }
    let args: Option<Vec<String>> = argv.map(OsString::into_string).map(Result::ok).collect();
    let code = match args.as_deref() {
        Some([role, rest @ ..]) => run_role(role, rest),
        _ => {
            eprintln!("{CHILD_FLAG}: expected a role name and UTF-8 arguments");
            2
        }
    };
    std::process::exit(code);
}

/// Runs the named role from [`ROLES`]; status 2 if there is no such role.
pub fn run_role(role: &str, args: &[String]) -> i32 {
    match ROLES.iter().find(|(name, _)| *name == role) {
        Some((_, run)) => run(args),
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
    if fd <= 2 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("fd {fd} is a standard stream")));
    }
    // SAFETY: F_GETFD reads descriptor flags and touches no memory; on a closed
    // descriptor it fails with EBADF, which is what we test for.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor is open (checked above) and was inherited for this role
    // alone; nothing else in this freshly exec'd process refers to it, so the OwnedFd
    // is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Parses a numeric argument of a child role.
pub fn num_arg(args: &[String], index: usize, what: &str) -> io::Result<usize> {
    args.get(index)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("missing or bad {what}")))
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

    #[test]
    fn role_names_are_unique() {
        for (i, (a, _)) in ROLES.iter().enumerate() {
            assert!(ROLES[i + 1..].iter().all(|(b, _)| a != b), "{a} twice");
        }
    }

    #[test]
    fn unknown_role_fails() {
        assert_eq!(run_role("no-such-role", &[]), 2);
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
