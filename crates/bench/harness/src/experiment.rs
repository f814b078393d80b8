//! What an experiment is to the harness, and the rules a registry of them follows.
//!
//! Each experiment is declared once, as a `static` [`Experiment`] in the module that
//! implements it: its name, the line `--help` shows, the papers' figures it reproduces,
//! how long it takes, the child roles its peers run in, its extra command-line
//! arguments and its run function. The registry is a slice of `&'static Experiment`
//! that the `ictus` binary assembles (`cli/src/main.rs`); the command line, the testbed
//! and the child dispatcher all read that one slice.
//!
//! Why a slice assembled by the binary, and not a list inside this crate or a
//! link-time collection (`inventory`, `linkme`): experiments live in several crates (the
//! papers' own in `ictus-experiments`, and the servers' in theirs), which all depend on
//! this one, so this crate cannot name them; a link-time list would find whatever
//! happens to be linked, in an order nobody wrote down. One line per experiment in the
//! binary is explicit, ordered (the order of `ictus bench --list`) and checked by
//! [`check_registry`].

use std::path::{Path, PathBuf};

use crate::pin::PinPlan;
use crate::report::{svg_path_for, Report};
use crate::BenchError;

/// A process role: the harness re-executes the current binary as
/// `exe __bench-child NAME ARGS…`, and the child dispatcher
/// ([`crate::child::maybe_run_child`]) runs `run(ARGS)` and exits with its status.
///
/// A role must exit by itself when its parent is done with it (end of file on its
/// channel, or the equivalent), and it dies with its parent anyway
/// (`PR_SET_PDEATHSIG`).
#[derive(Debug)]
pub struct Role {
    /// The name on the command line, unique across the registry.
    pub name: &'static str,
    /// The role's `main`: the arguments after the name; the exit status.
    pub run: fn(&[String]) -> i32,
}

/// One experiment, as `ictus bench NAME` runs it.
#[derive(Debug)]
pub struct Experiment {
    /// The name on the command line (lower case, digits and `-`), unique.
    pub name: &'static str,
    /// One line for `ictus bench --help` and the top of `ictus bench NAME --help`.
    pub about: &'static str,
    /// The numbers of the papers' figures ([`FIGURES`]) it reproduces.
    pub figures: &'static [u8],
    /// About how long `--quick` takes, in seconds (a loaded two-core VM).
    pub quick_s: f64,
    /// About how long the full run takes, in seconds.
    pub full_s: f64,
    /// The child roles its peers run in.
    pub roles: &'static [&'static Role],
    /// Command-line arguments beyond the common ones ([`no_args`] for none); the run
    /// function reads them from [`Options::extra`].
    pub args: fn() -> Vec<clap::Arg>,
    /// Measures, and returns the report and its plots; the harness prints the table
    /// and writes the files.
    pub run: fn(&Options) -> Result<Outcome, BenchError>,
}

/// For [`Experiment::args`]: no extra arguments.
pub fn no_args() -> Vec<clap::Arg> {
    Vec::new()
}

/// What every run of an experiment is given: the common options, parsed once.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Seconds, not minutes (`--quick`).
    pub quick: bool,
    /// Where the client and the servers run (`--pin`); `None`: where the scheduler
    /// puts them. Experiments that place no threads ignore it.
    pub pin: Option<PinPlan>,
    /// Print progress to standard error (`--progress`).
    pub progress: bool,
    /// The experiment's own arguments ([`Experiment::args`]).
    pub extra: clap::ArgMatches,
}

impl Options {
    /// Quick mode and nothing else: what tests run.
    pub fn quick() -> Options {
        Options { quick: true, ..Options::default() }
    }

    /// The value of the experiment's own argument `id` ([`Experiment::args`]), if it
    /// was given or has a default; `None` also when the matches do not know `id` (as
    /// in [`Options::quick`]).
    pub fn arg<T: Clone + Send + Sync + 'static>(&self, id: &str) -> Option<T> {
        self.extra.try_get_one::<T>(id).ok().flatten().cloned()
    }

    /// Prints a progress line to standard error with `--progress`.
    pub fn say(&self, line: impl std::fmt::Display) {
        if self.progress {
            eprintln!("{line}");
        }
    }
}

/// A plot an experiment drew, and where it goes: beside the JSON file, named after it
/// (`NAME.json` → `NAME{suffix}.svg`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlotFile {
    /// Empty for the experiment's main plot, e.g. `-timesharing` for another.
    pub suffix: &'static str,
    /// The SVG document.
    pub svg: String,
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The result, for the table and the JSON object.
    pub report: Report,
    /// Its plots, written beside the JSON.
    pub plots: Vec<PlotFile>,
}

impl Outcome {
    /// A report and its main plot.
    pub fn new(report: Report, svg: String) -> Outcome {
        Outcome { report, plots: vec![PlotFile { suffix: "", svg }] }
    }

    /// Adds another plot, written as `NAME{suffix}.svg`.
    pub fn with_plot(mut self, suffix: &'static str, svg: String) -> Outcome {
        self.plots.push(PlotFile { suffix, svg });
        self
    }

    /// Writes the JSON object to `json` and the plots beside it.
    pub fn write(&self, json: &Path) -> Result<(), BenchError> {
        self.report.write_json(json).map_err(|e| BenchError::io(format!("writing {}", json.display()), e))?;
        for plot in &self.plots {
            let path = plot_path(json, plot.suffix);
            std::fs::write(&path, &plot.svg).map_err(|e| BenchError::io(format!("writing {}", path.display()), e))?;
        }
        Ok(())
    }
}

/// Where a plot with `suffix` goes for the JSON file `json`: the same name with an
/// `.svg` extension for the main plot, `STEM{suffix}.svg` beside it otherwise.
pub fn plot_path(json: &Path, suffix: &str) -> PathBuf {
    if suffix.is_empty() {
        return svg_path_for(json);
    }
    let stem = json.file_stem().map_or_else(|| "plot".into(), |s| s.to_string_lossy().into_owned());
    json.with_file_name(format!("{stem}{suffix}.svg"))
}

/// The papers' figures listed in `shared/BENCHMARKS.md`: number, what, where.
pub const FIGURES: [(u8, &str, &str); 19] = [
    (1, "transfer costs", "000 §8, Fig. 3"),
    (2, "file read methods", "000 Table 2"),
    (3, "timer overhead", "000 §6"),
    (4, "MIDI interarrival plot", "000 Fig. 1"),
    (5, "MIDI latency under load", "000 Table 1"),
    (6, "display transfer", "000 §10"),
    (7, "frame timing model", "000 §11"),
    (8, "MARS throughput", "001 Table 1"),
    (9, "MARS under load", "001 Table 2"),
    (10, "MARS periodic streams", "001 Table 3"),
    (11, "display transports", "002 Table 1"),
    (12, "display macrobenchmarks", "002 §4.2"),
    (13, "RT-IPC message cost", "003 §5.1"),
    (14, "Distributed Hartstone", "003 Table 2"),
    (15, "compile test", "004 §5.1"),
    (16, "modified Andrew benchmark", "004 §5.2"),
    (17, "file system throughput", "004 §5.3"),
    (18, "file system operations", "004 §5.3"),
    (19, "process management", "004 §5.4"),
];

/// The experiment named `name`.
pub fn find<'r>(registry: &[&'r Experiment], name: &str) -> Option<&'r Experiment> {
    registry.iter().copied().find(|e| e.name == name)
}

/// The harness's own roles, which every binary that embeds it can run.
pub fn harness_roles() -> &'static [&'static Role] {
    static ROLES: [&Role; 1] = [&crate::load::ROLE];
    &ROLES
}

/// The role named `name`: the harness's own, or one an experiment of `registry`
/// declares.
pub fn find_role(registry: &[&Experiment], name: &str) -> Option<&'static Role> {
    harness_roles().iter().chain(registry.iter().flat_map(|e| e.roles.iter())).copied().find(|r| r.name == name)
}

/// Checks what the command line, the testbed and the child dispatcher rely on: names
/// are unique and spelled as a command line wants them; a role name means one role
/// (experiments that share a peer list the same `static`); figures are numbers of
/// [`FIGURES`]; expected durations are positive.
pub fn check_registry(registry: &[&Experiment]) -> Result<(), String> {
    for (i, e) in registry.iter().enumerate() {
        let spelled = !e.name.is_empty()
            && !e.name.starts_with('-')
            && e.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !spelled {
            return Err(format!("experiment name {:?}: use lower case, digits and '-'", e.name));
        }
        if registry[..i].iter().any(|o| o.name == e.name) {
            return Err(format!("experiment {:?} is registered twice", e.name));
        }
        if e.about.trim().is_empty() || e.about.contains('\n') {
            return Err(format!("{}: `about` must be one line", e.name));
        }
        if let Some(f) = e.figures.iter().find(|f| !FIGURES.iter().any(|(n, _, _)| n == *f)) {
            return Err(format!("{}: figure #{f} is not one of the {} in BENCHMARKS.md", e.name, FIGURES.len()));
        }
        if !(e.quick_s > 0.0 && e.full_s >= e.quick_s) {
            return Err(format!("{}: expected durations must be positive, full at least quick", e.name));
        }
    }
    let roles: Vec<(&str, &Role)> = harness_roles()
        .iter()
        .map(|r| ("the harness", *r))
        .chain(registry.iter().flat_map(|e| e.roles.iter().map(|r| (e.name, *r))))
        .collect();
    for (i, (owner, role)) in roles.iter().enumerate() {
        if let Some((other, _)) = roles[..i].iter().find(|(_, r)| r.name == role.name && !std::ptr::eq(*r, *role)) {
            return Err(format!("role {:?} of {owner} is another role of the same name in {other}", role.name));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn fail(_: &Options) -> Result<Outcome, BenchError> {
        Err(BenchError::io("test", std::io::Error::other("not a real experiment")))
    }

    fn exit_zero(_: &[String]) -> i32 {
        0
    }

    pub static ECHO: Role = Role { name: "echo", run: exit_zero };
    static OTHER_ECHO: Role = Role { name: "echo", run: exit_zero };

    const fn fake(
        name: &'static str,
        about: &'static str,
        figures: &'static [u8],
        roles: &'static [&'static Role],
    ) -> Experiment {
        Experiment { name, about, figures, quick_s: 8.0, full_s: 150.0, roles, args: no_args, run: fail }
    }

    /// Stand-ins for the registry's first two experiments, as the testbed's tests
    /// expect them.
    pub static IPC: Experiment = fake("ipc", "transfer costs", &[1], &[&ECHO]);
    pub static FILEREAD: Experiment = fake("fileread", "file read methods", &[2], &[&ECHO]);
    pub static REGISTRY: &[&Experiment] = &[&IPC, &FILEREAD];

    #[test]
    fn a_good_registry_passes_and_roles_are_found() {
        check_registry(REGISTRY).expect("good");
        assert!(std::ptr::eq(find_role(REGISTRY, "echo").expect("echo"), &ECHO));
        assert!(std::ptr::eq(find_role(&[], "load").expect("the harness's own"), &crate::load::ROLE));
        assert!(find_role(REGISTRY, "nope").is_none());
        assert_eq!(find(REGISTRY, "fileread").map(|e| e.figures), Some(&[2u8][..]));
    }

    #[test]
    fn bad_registries_are_refused() {
        let twice = check_registry(&[&IPC, &IPC]).expect_err("twice");
        assert!(twice.contains("twice"), "{twice}");
        static BAD_NAME: Experiment = fake("Bad name", "x", &[], &[]);
        assert!(check_registry(&[&BAD_NAME]).is_err());
        static BAD_FIGURE: Experiment = fake("x", "x", &[20], &[]);
        assert!(check_registry(&[&BAD_FIGURE]).expect_err("figure").contains("#20"));
        static CLASH: Experiment = fake("y", "x", &[], &[&OTHER_ECHO]);
        assert!(check_registry(&[&IPC, &CLASH]).expect_err("role").contains("echo"));
        static LOAD: Role = Role { name: "load", run: exit_zero };
        static LOAD_CLASH: Experiment = fake("z", "x", &[], &[&LOAD]);
        assert!(check_registry(&[&LOAD_CLASH]).expect_err("role").contains("load"));
        static TWO_LINES: Experiment = fake("w", "a\nb", &[], &[]);
        assert!(check_registry(&[&TWO_LINES]).is_err());
    }

    #[test]
    fn an_argument_the_matches_do_not_know_is_absent() {
        let opts = Options::quick();
        assert!(opts.quick && opts.pin.is_none() && !opts.progress);
        assert_eq!(opts.arg::<std::path::PathBuf>("dir"), None, "no panic on an unknown id");
        let cmd = clap::Command::new("x").arg(clap::Arg::new("n").long("n").value_parser(clap::value_parser!(usize)));
        let opts = Options { extra: cmd.try_get_matches_from(["x", "--n", "3"]).expect("ok"), ..Options::default() };
        assert_eq!(opts.arg::<usize>("n"), Some(3));
        assert_eq!(opts.arg::<String>("n"), None, "a type other than declared is absent, not a panic");
    }

    #[test]
    fn plots_go_beside_the_json() {
        assert_eq!(plot_path(Path::new("out/ipc.json"), ""), Path::new("out/ipc.svg"));
        assert_eq!(plot_path(Path::new("/x/m.json"), "-timesharing"), Path::new("/x/m-timesharing.svg"));
        assert_eq!(plot_path(Path::new("ipc"), ""), Path::new("ipc.svg"));
    }
}
