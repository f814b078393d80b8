//! The command line of `ictus bench NAME`: one subcommand per experiment, built from
//! its [`Experiment`] declaration, with the options every experiment takes (parsed
//! here, once) and the ones it declares itself.
//!
//! The `ictus` binary puts these subcommands under `ictus bench`, so that a new
//! experiment needs no line of command-line code.

use std::path::PathBuf;

use clap::{value_parser, Arg, ArgAction, ArgMatches, Command};
use ictus_args::Placement;

use crate::experiment::{Experiment, Options};
use crate::pin::PinPlan;
use crate::BenchError;

/// The subcommand `NAME` of `ictus bench`: the common options, then the experiment's.
pub fn command(e: &Experiment) -> Command {
    Command::new(e.name)
        .about(e.about)
        .arg(
            Arg::new("quick")
                .long("quick")
                .action(ArgAction::SetTrue)
                .help("Seconds, not minutes: fewer sizes' iterations, for smoke tests"),
        )
        .arg(
            Arg::new("json")
                .long("json")
                .value_name("JSON")
                .value_parser(value_parser!(PathBuf))
                .help("Write the result as one JSON object to this file (and plots beside it)"),
        )
        .arg(
            Arg::new("pin")
                .long("pin")
                .value_name("PIN")
                .default_value("0")
                .value_parser(ictus_args::placement())
                .help(format!(
                "CPU placement: `C` puts client and servers on CPU C (the papers' machines had one CPU), `C,S` the \
                 client on C and the servers on S, `none` lets the scheduler choose (on a VM, where it places them \
                 changes small round trips several-fold); {}",
                ictus_args::cpu_range_help()
            )),
        )
        .arg(Arg::new("progress").long("progress").action(ArgAction::SetTrue).help("Print progress to standard error"))
        .args((e.args)())
}

/// A parsed `ictus bench NAME …`: what the run is given, and where its files go.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The options the run function reads.
    pub options: Options,
    /// `--json FILE`.
    pub json: Option<PathBuf>,
}

/// Reads the common options out of the subcommand's matches (from [`command`]); the
/// matches themselves become [`Options::extra`].
pub fn invocation(matches: &ArgMatches) -> Result<Invocation, BenchError> {
    let pin = match matches.get_one::<Placement>("pin") {
        None | Some(Placement::Unpinned) => None,
        Some(&Placement::Cpus { client, server }) => Some(PinPlan { client, server }),
    };
    Ok(Invocation {
        options: Options {
            quick: matches.get_flag("quick"),
            pin,
            progress: matches.get_flag("progress"),
            extra: matches.clone(),
        },
        json: matches.get_one::<PathBuf>("json").cloned(),
    })
}

/// Runs the experiment, writes its JSON and plots with `--json`, and prints its table.
pub fn run(e: &Experiment, invocation: &Invocation) -> Result<(), BenchError> {
    let outcome = (e.run)(&invocation.options)?;
    if let Some(json) = &invocation.json {
        outcome.write(json)?;
    }
    outcome.report.print_table();
    Ok(())
}

/// What `ictus bench --list` prints: the names, one per line, in the registry's order.
pub fn list(registry: &[&Experiment]) -> String {
    registry.iter().map(|e| format!("{}\n", e.name)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::tests::{IPC, REGISTRY};

    #[test]
    fn common_options_are_parsed_once_for_every_experiment() {
        let cmd = ictus_args::harden(command(&IPC));
        cmd.clone().debug_assert();
        let m = cmd.clone().try_get_matches_from(["ipc", "--quick", "--json", "x.json", "--pin", "none"]).expect("ok");
        let inv = invocation(&m).expect("valid");
        assert!(inv.options.quick && !inv.options.progress);
        assert_eq!(inv.options.pin, None);
        assert_eq!(inv.json, Some(PathBuf::from("x.json")));
        let m = cmd.clone().try_get_matches_from(["ipc", "--progress"]).expect("ok");
        let inv = invocation(&m).expect("valid");
        assert_eq!(inv.options.pin.map(|p| (p.client, p.server)), Some((0, 0)), "CPU 0 by default");
        assert!(inv.options.progress && !inv.options.quick && inv.json.is_none());
        for bad in ["x", "-1", "nan", "0,0,0", "99999", ""] {
            let e = cmd.clone().try_get_matches_from(["ipc", "--pin", bad]).expect_err(bad);
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{bad}: {e}");
        }
        assert!(cmd.try_get_matches_from(["ipc", "--bogus"]).is_err());
    }

    #[test]
    fn the_list_is_one_name_per_line() {
        assert_eq!(list(REGISTRY), "ipc\nfileread\n");
    }
}
