//! Hostile command lines, for every argument of every subcommand: the test walks clap's
//! command tree, so an argument added later is covered without anyone listing it.
//!
//! - No argument that takes a value may be parsed as a raw integer, float or duration:
//!   numbers go through `ictus_args`, whose parsers the walk recognises by the type
//!   they make.
//! - Each numeric argument states its range in its help as its parser does, takes both
//!   ends of it, and refuses hostile values (negative, NaN, infinities, huge numbers,
//!   empty, just outside the range — zero where zero is outside) in a real process:
//!   exit status 2, one line naming the flag and the range, no panic, nothing left in
//!   its (private) runtime directory.
//!
//! The process is this test binary run as `ictus` ([`as_ictus`]): the binary's
//! `main` is `run(std::env::args_os())`, and a unit test cannot name the built binary.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command as Process;

use super::*;

/// Values no numeric argument of any kind may take.
const HOSTILE: &[&str] = &[
    "",
    "-1",
    "-0.5",
    "-0.000001",
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "+inf",
    "infinity",
    "1e300",
    "-1e300",
    "1e308",
    "1e309",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "99999999999999999999999999999999999999999999999999",
    "0x10",
    "one",
    " 1",
];

/// The environment variable that turns this test binary into `ictus`: a JSON array of
/// arguments.
const AS_ICTUS: &str = "ICTUS_TEST_RUN_AS_ICTUS";

/// Not a test of its own: when [`AS_ICTUS`] is set, runs `ictus` with those arguments
/// and exits with its status, as the binary's `main` does.
#[test]
fn as_ictus() {
    let Some(json) = std::env::var_os(AS_ICTUS) else { return };
    let args: Vec<String> = serde_json::from_str(json.to_str().expect("UTF-8")).expect("a JSON array");
    let code = run(std::iter::once(OsString::from("ictus")).chain(args.into_iter().map(OsString::from)));
    std::process::exit(i32::from(code));
}

/// What a run of `ictus` did.
struct Ran {
    code: Option<i32>,
    stderr: String,
}

/// Runs `ictus ARGS` in a process of its own with `runtime` as `XDG_RUNTIME_DIR`.
fn ictus(args: &[String], runtime: &Path) -> Ran {
    let out = Process::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", "hostile::as_ictus", "--nocapture", "--test-threads", "1", "-q"])
        .env(AS_ICTUS, serde_json::to_string(args).expect("JSON"))
        .env("XDG_RUNTIME_DIR", runtime)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("spawn");
    Ran { code: out.status.code(), stderr: String::from_utf8_lossy(&out.stderr).into_owned() }
}

/// A numeric argument somewhere in the tree.
#[derive(Debug, Clone)]
struct Numeric {
    /// The subcommands leading to it, e.g. `["midi", "play"]`.
    path: Vec<String>,
    /// Placeholders for the positional arguments before it, if it is one.
    before: Vec<String>,
    /// `--speed`, or `<US>` for a positional.
    flag: String,
    /// How it is given: `["--speed"]`, or nothing for a positional.
    spelled: Vec<String>,
    /// Its help, short and long.
    help: String,
}

impl Numeric {
    fn line(&self, value: &str) -> Vec<String> {
        let mut line = self.path.clone();
        line.extend(self.before.iter().cloned());
        line.extend(self.spelled.iter().cloned());
        line.push(value.to_string());
        line
    }

    fn name(&self) -> String {
        format!("ictus {} {}", self.path.join(" "), self.flag)
    }
}

/// A value the parser of a positional argument before the one under test takes.
fn placeholder(arg: &clap::Arg) -> String {
    arg.get_possible_values().first().map_or_else(|| "x".to_string(), |v| v.get_name().to_string())
}

/// Every argument that takes a value: the numeric ones, and the names of those parsed
/// as raw numbers.
fn walk(cmd: &clap::Command, path: &mut Vec<String>, numeric: &mut Vec<Numeric>, raw: &mut Vec<String>) {
    let mut positionals: Vec<&clap::Arg> = cmd.get_positionals().collect();
    positionals.sort_by_key(|a| a.get_index());
    for arg in cmd.get_arguments() {
        if !arg.get_action().takes_values() {
            continue;
        }
        let parser = arg.get_value_parser();
        let (flag, spelled) = match (arg.get_long(), arg.get_short()) {
            (Some(long), _) => (format!("--{long}"), vec![format!("--{long}")]),
            (None, Some(short)) => (format!("-{short}"), vec![format!("-{short}")]),
            (None, None) => (format!("<{}>", arg.get_id().as_str().to_uppercase()), Vec::new()),
        };
        if ictus_args::is_raw_number(parser) {
            raw.push(format!("ictus {} {flag}", path.join(" ")));
        } else if ictus_args::is_checked(parser) {
            let before = if arg.is_positional() {
                positionals.iter().take_while(|p| p.get_id() != arg.get_id()).map(|p| placeholder(p)).collect()
            } else {
                Vec::new()
            };
            let help = format!(
                "{} {}",
                arg.get_help().map(|h| h.to_string()).unwrap_or_default(),
                arg.get_long_help().map(|h| h.to_string()).unwrap_or_default()
            );
            numeric.push(Numeric { path: path.clone(), before, flag, spelled, help });
        }
    }
    for sub in cmd.get_subcommands() {
        path.push(sub.get_name().to_string());
        walk(sub, path, numeric, raw);
        path.pop();
    }
}

/// The built, hardened command tree's numeric arguments; fails on a raw one.
fn numeric_arguments() -> Vec<Numeric> {
    let mut cmd = command();
    cmd.build();
    let (mut numeric, mut raw) = (Vec::new(), Vec::new());
    walk(&cmd, &mut Vec::new(), &mut numeric, &mut raw);
    assert!(
        raw.is_empty(),
        "arguments parsed as raw numbers (declare them with a parser of ictus_args, which checks the range): {raw:?}"
    );
    numeric
}

/// Parses in this process; `Err` with clap's message if the value itself was refused.
fn parse_value(n: &Numeric, value: &str) -> Result<(), String> {
    let line = std::iter::once("ictus".to_string()).chain(n.line(value));
    match command().try_get_matches_from(line) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == clap::error::ErrorKind::ValueValidation => Err(e.to_string()),
        // Another argument missing, or the like: the value itself was taken.
        Err(_) => Ok(()),
    }
}

/// The values just outside `[min, max]` as stated: below (if there is a number below
/// `min`) and above.
fn just_outside(min: &str, max: &str) -> Vec<String> {
    let whole = !min.contains('.') && !max.contains('.');
    let mut out = Vec::new();
    if whole {
        let (min, max): (u128, u128) = (min.parse().expect("min"), max.parse().expect("max"));
        if min > 0 {
            out.extend([(min - 1).to_string(), "0".to_string()]);
        }
        out.push((max + 1).to_string());
    } else {
        let (min, max): (f64, f64) = (min.parse().expect("min"), max.parse().expect("max"));
        if min > 0.0 {
            out.extend([(min / 2.0).to_string(), "0".to_string()]);
        }
        out.push((max + max.max(1.0) * 0.01).to_string());
    }
    out
}

#[test]
fn no_argument_takes_a_raw_number_and_the_known_numbers_are_found() {
    let names: Vec<String> = numeric_arguments().iter().map(Numeric::name).collect();
    for known in [
        "ictus midi decode --idle-timeout",
        "ictus midi decode --count",
        "ictus midi decode --max-sysex",
        "ictus midi play --speed",
        "ictus midi monitor --duration",
        "ictus load --seconds",
        "ictus load --threads",
        "ictus clock-server --fifo",
        "ictus clock set-resolution <US>",
        "ictus bench ipc --pin",
        "ictus bench alarm --pin-clock-pair",
        "ictus mars serve --buffer-size",
        "ictus mars serve --rt-reserve",
        "ictus mars serve --capability",
        "ictus mars serve --min-readahead",
        "ictus mars volume create --interleave",
        "ictus mars quantum <SECTORS>",
        "ictus bench display --refresh-hz",
        "ictus bench display --spin-us",
        "ictus display serve --width",
        "ictus display serve --refresh-hz",
        "ictus display demo --seconds",
    ] {
        assert!(names.iter().any(|n| n == known), "{known} not found among {names:?}");
    }
}

#[test]
fn every_numeric_argument_states_its_range_and_takes_both_ends() {
    for n in numeric_arguments() {
        let refusal = parse_value(&n, "").expect_err(&format!("{}: empty accepted", n.name()));
        let (min, max) =
            ictus_args::stated_range(&refusal).unwrap_or_else(|| panic!("{}: no range in {refusal}", n.name()));
        assert!(
            n.help.contains(&format!("{min} to {max}")),
            "{}: the help must state the range \"{min} to {max}\": {}",
            n.name(),
            n.help
        );
        for end in [&min, &max] {
            assert_eq!(parse_value(&n, end), Ok(()), "{}: {end} is in its range", n.name());
        }
    }
}

#[test]
fn every_numeric_argument_refuses_hostile_values_before_anything_starts() {
    let arguments = numeric_arguments();
    let failures = std::sync::Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    // Two workers: each run is a process start and a parse, and this machine is shared.
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(n) = arguments.get(i) else { break };
                let refusal = parse_value(n, "").expect_err("empty is refused");
                let (min, max) = ictus_args::stated_range(&refusal).expect("a stated range");
                let runtime = ictus_testkit::TempDir::new("hostile-args");
                let values = HOSTILE.iter().map(|v| v.to_string()).chain(just_outside(&min, &max));
                for value in values {
                    let ran = ictus(&n.line(&value), runtime.path());
                    let lines: Vec<&str> = ran.stderr.lines().collect();
                    let left: Vec<_> = std::fs::read_dir(runtime.path())
                        .expect("runtime dir")
                        .map(|e| e.expect("entry").path())
                        .collect();
                    let ok = ran.code == Some(2)
                        && !ran.stderr.contains("panicked")
                        && lines.len() == 1
                        && lines[0].contains(&format!("for '{}", n.flag))
                        && lines[0].contains(&format!("from {min} to {max}"))
                        && left.is_empty();
                    if !ok {
                        failures.lock().expect("lock").push(format!(
                            "{} {value:?}: exit {:?}, left {left:?}, stderr: {}",
                            n.name(),
                            ran.code,
                            ran.stderr
                        ));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().expect("lock");
    assert!(failures.is_empty(), "{} hostile values not refused cleanly:\n{}", failures.len(), failures.join("\n"));
}

/// `ictus ARGS` as parsed, or the line that refuses it (a clap error, or a
/// contradiction), without running anything.
fn refused(args: &[&str]) -> Option<String> {
    let line = std::iter::once("ictus").chain(args.iter().copied());
    match command().try_get_matches_from(line).and_then(|m| Cli::from_arg_matches(&m)) {
        Err(e) => Some(e.to_string()),
        Ok(cli) => contradiction(&cli),
    }
}

#[test]
fn arguments_that_contradict_each_other_are_refused() {
    for (args, says) in [
        (&["midi", "decode", "--idle-timeout", "5"][..], "--device"),
        (&["midi", "decode", "--device", "cable:x", "f.bin"][..], "cannot be used"),
        (&["midi", "monitor", "--name", "x"][..], "--server"),
        (&["midi", "monitor", "--name-server", "x"][..], "--server"),
        (&["midi", "monitor", "--server", "--device", "cable:x"][..], "cannot be used"),
        (&["midi-server", "--stats", "--device", "cable:x"][..], "cannot be used"),
        (&["midi-server", "--stats", "--timesharing"][..], "cannot be used"),
        (&["load", "cpu", "--dir", "/tmp"][..], "--dir"),
        (&["clock", "--control-socket", "x", "now"][..], "--control-socket"),
        (&["clock", "--name-server", "x", "stats"][..], "--name-server"),
        (&["clock", "--name-server", "x", "set-resolution", "0"][..], "--name-server"),
        (&["testbed", "--only", "nope"][..], "nope"),
        (&["mars", "serve", "--volume", "a", "--no-ports", "--name-server", "x"][..], "cannot be used"),
        (&["mars", "serve", "--volume", "a", "--no-ports", "--control-socket", "x"][..], "cannot be used"),
        (&["mars", "serve", "--volume", "a", "--fifo", "10", "--timesharing"][..], "cannot be used"),
        // Settings of a cluster node, given to a node of a local volume (they were ignored).
        (&["mars", "serve", "--volume", "a", "--cache", "16777216"][..], "cannot be used"),
        (&["mars", "serve", "--volume", "a", "--ahead", "1048576"][..], "cannot be used"),
        (&["bench", "mars", "--only", "table9"][..], "table9"),
        (&["unix", "run", "--server", "--stats", "true"][..], "cannot be used"),
        (&["unix", "run", "--server", "--policy", "p", "true"][..], "cannot be used"),
        (&["unix", "run", "--socket", "x", "true"][..], "--server"),
        (&["display", "serve", "--headless", "--display", ":1"][..], "cannot be used"),
        (&["display", "serve", "--headless", "--no-mit-shm"][..], "cannot be used"),
        (&["display", "serve", "--width", "640"][..], "--headless"),
    ] {
        let why = refused(args).unwrap_or_else(|| panic!("{args:?} accepted"));
        assert!(why.contains(says), "{args:?}: {why}");
    }
    for args in [
        &["midi", "decode", "--device", "cable:x", "--idle-timeout", "5"][..],
        &["midi", "monitor", "--server", "--name", "x"][..],
        &["midi", "monitor"][..],
        &["midi-server", "--stats"][..],
        &["midi-server"][..],
        &["load", "disk", "--dir", "/tmp"][..],
        &["clock", "--control-socket", "x", "stats"][..],
        &["clock", "--name-server", "x", "now"][..],
        &["testbed", "--only", "ipc", "alarm"][..],
        &["mars", "serve", "--volume", "a", "--no-ports"][..],
        &["mars", "serve", "--volume", "a", "--timesharing"][..],
        &["bench", "mars", "--quick", "--only", "table1,http"][..],
        &["unix", "run", "--server", "--socket", "x", "true"][..],
        &["unix", "run", "--stats", "--policy", "p", "true"][..],
        &["display", "serve", "--headless", "--width", "640", "--height", "480"][..],
        &["display", "serve", "--display", ":1", "--no-mit-shm"][..],
    ] {
        assert_eq!(refused(args), None, "{args:?}");
    }
}

#[test]
fn a_refused_value_is_one_line_and_status_2_in_a_real_process() {
    let runtime = ictus_testkit::TempDir::new("hostile-args");
    let ran = ictus(
        &["midi".into(), "decode".into(), "--device".into(), "cable:x".into(), "--idle-timeout".into(), "nan".into()],
        runtime.path(),
    );
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert_eq!(
        ran.stderr.trim_end(),
        "error: invalid value 'nan' for '--idle-timeout <SECONDS>': not a number; expected a number of seconds from 0.001 to 86400"
    );
    let ran = ictus(&["load".into(), "cpu".into(), "--dir".into(), "/tmp".into()], runtime.path());
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert_eq!(ran.stderr.lines().count(), 1, "{}", ran.stderr);
}
