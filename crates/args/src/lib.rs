//! Numbers on ictus command lines: one checked type per kind of number.
//!
//! A command line is input from outside like any other. A number on it is parsed by the
//! parser of its kind, given the flag's range where the flag is declared:
//!
//! | kind | parser | value | text |
//! | --- | --- | --- | --- |
//! | durations | [`seconds`] | [`Seconds`] | decimal seconds: `0.5`, `60` |
//! | short durations | [`micros`] | [`Micros`] | whole microseconds |
//! | speeds | [`speed`] | [`Speed`] | a factor: `0.5`, `2` |
//! | rates | [`rate`] | [`Rate`] | per second |
//! | percentages | [`percent`] | [`Percent`] | `0` to `100` |
//! | counts | [`count`] | [`Count`] | a whole number |
//! | sizes | [`bytes`] | [`Bytes`] | whole bytes |
//! | priorities | [`priority`] | [`Priority`] | `SCHED_FIFO` 1–99 |
//! | ports | [`port`] | [`Port`] | a TCP/UDP port |
//! | CPUs | [`cpu`] | [`Cpu`] | one CPU this process may run on |
//! | CPU placements | [`placement`] | [`Placement`] | `none`, `C` or `C,S` |
//!
//! Each refuses an empty value, text that is not a number, NaN, infinities, negative
//! numbers, fractions where a whole number is meant and anything outside the flag's
//! range, with one line that names the flag and the range:
//!
//! ```text
//! error: invalid value 'nan' for '--speed <FACTOR>': not a number; expected a speed factor from 0.01 to 100
//! ```
//!
//! The rules the `ictus` binary keeps, and that its test of the whole command tree
//! holds (so that a flag added later cannot forget them):
//!
//! - no argument is parsed as a raw integer or float ([`is_raw_number`]); every number
//!   goes through one of these parsers ([`is_checked`]);
//! - the flag's help states its range as the parser does, `MIN to MAX`;
//! - the command is [`harden`]ed before parsing, so that `-1` or `-inf` reach the parser
//!   (and are refused as negative) instead of being taken for flags;
//! - a parse error is reported with [`report_error`]: one line for a refused value,
//!   exit status 2, before anything starts.
//!
//! The types are a crate of their own so that every crate that declares clap arguments
//! (the `ictus` binary, the harness, the experiments, the servers' command lines) can
//! use them without depending on any other part of ictus; the OS layer and the runtime
//! stay free of clap.

#![deny(unsafe_code)]

use std::any::TypeId;
use std::fmt;
use std::num::IntErrorKind;
use std::time::Duration;

use clap::builder::{StringValueParser, TypedValueParser, ValueParser};
use clap::error::ErrorKind;
use clap::Command;
use rustix::thread::{sched_getaffinity, CpuSet};

/// The longest duration any flag may declare, in seconds (about 31 700 years): far
/// inside what [`Duration`] holds, so converting a checked value cannot fail.
const MAX_DECLARED_SECONDS: f64 = 1e12;

/// A number of a kind, with the words that describe it in an error.
#[derive(Debug, Clone, Copy)]
struct Kind {
    /// "a speed factor", as in "expected a speed factor from 0.01 to 100".
    what: &'static str,
    /// Written after the range: "" or e.g. " bytes".
    unit: &'static str,
}

/// A refusal: why, then what was expected, on one line.
fn refusal(why: &str, kind: Kind, range: &str) -> String {
    format!("{why}; expected {} {range}{}", kind.what, kind.unit)
}

/// Checks a decimal number against `[min, max]`.
fn check_float(text: &str, kind: Kind, min: f64, max: f64) -> Result<f64, String> {
    let range = format!("from {min} to {max}");
    let refuse = |why: &str| Err(refusal(why, kind, &range));
    if text.is_empty() {
        return refuse("empty");
    }
    let Ok(v) = text.parse::<f64>() else { return refuse("not a number") };
    if v.is_nan() {
        refuse("not a number")
    } else if v.is_infinite() {
        refuse("not finite")
    } else if v < 0.0 {
        refuse("negative")
    } else if v < min || v > max {
        refuse("out of range")
    } else {
        Ok(v)
    }
}

/// Checks a whole number against `[min, max]`.
fn check_int(text: &str, kind: Kind, min: u64, max: u64) -> Result<u64, String> {
    let range = format!("from {min} to {max}");
    let refuse = |why: &str| Err(refusal(why, kind, &range));
    if text.is_empty() {
        return refuse("empty");
    }
    match text.parse::<u64>() {
        Ok(v) if v < min || v > max => refuse("out of range"),
        Ok(v) => Ok(v),
        Err(e) if *e.kind() == IntErrorKind::PosOverflow => refuse("out of range"),
        // Not a whole number in digits: say what it is instead.
        Err(_) => match text.parse::<f64>() {
            Err(_) => refuse("not a number"),
            Ok(v) if v.is_nan() => refuse("not a number"),
            Ok(v) if v.is_infinite() => refuse("not finite"),
            Ok(v) if v < 0.0 || text.starts_with('-') => refuse("negative"),
            Ok(v) if v > max as f64 => refuse("out of range"),
            Ok(_) => refuse("not a whole number"),
        },
    }
}

/// The range a refusal states, `(MIN, MAX)` as written: what the flag's help must
/// state too (`MIN to MAX`). Reads the last "from MIN to MAX" of `message`.
pub fn stated_range(message: &str) -> Option<(String, String)> {
    let rest = &message[message.rfind(" from ")? + " from ".len()..];
    let (min, rest) = rest.split_once(" to ")?;
    let max: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let numeric = |s: &str| !s.is_empty() && s.parse::<f64>().is_ok();
    (numeric(min) && numeric(&max)).then(|| (min.to_string(), max))
}

fn assert_float_range(min: f64, max: f64) {
    assert!(
        min.is_finite() && max.is_finite() && 0.0 <= min && min <= max,
        "a flag's range must be finite, non-negative and ordered: {min} to {max}"
    );
}

/// Declares a value type for a kind whose text is a decimal number.
macro_rules! float_kind {
    ($(#[$doc:meta])* $name:ident($inner:ty), $parser:ident, $what:literal, $unit:literal, $convert:expr, $max:expr, $zero:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
        pub struct $name($inner);

        impl $name {
            /// The checked value.
            pub fn get(self) -> $inner {
                self.0
            }
        }

        #[doc = concat!("The parser of [`", stringify!($name), "`]: ", $what, " from `min` to `max`.")]
        ///
        /// # Panics
        ///
        /// If the range is not finite, negative or out of order, or admits a value the
        /// kind cannot be (zero, where it means nothing): a programming error, found
        /// when the command is built.
        pub fn $parser(min: f64, max: f64) -> impl TypedValueParser<Value = $name> {
            assert_float_range(min, max);
            assert!(max <= $max, "{} flags go up to {}", stringify!($name), $max);
            assert!($zero || min > 0.0, "{} is never zero: the range must start above it", stringify!($name));
            const KIND: Kind = Kind { what: $what, unit: $unit };
            StringValueParser::new()
                .try_map(move |text: String| check_float(&text, KIND, min, max).map(|v| $name($convert(v))))
        }
    };
}

/// Declares a value type for a kind whose text is a whole number.
macro_rules! int_kind {
    ($(#[$doc:meta])* $name:ident($inner:ty), $parser:ident, $what:literal, $unit:literal, $convert:expr, $lowest:expr, $highest:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name($inner);

        impl $name {
            /// The checked value.
            pub fn get(self) -> $inner {
                self.0
            }
        }

        #[doc = concat!("The parser of [`", stringify!($name), "`]: ", $what, " from `min` to `max`.")]
        ///
        /// # Panics
        ///
        /// If `min > max` or the range leaves what the kind can be: a programming error,
        /// found when the command is built.
        pub fn $parser(min: u64, max: u64) -> impl TypedValueParser<Value = $name> {
            let kind_range: std::ops::RangeInclusive<u64> = $lowest..=$highest;
            assert!(
                min <= max && kind_range.contains(&min) && kind_range.contains(&max),
                "a flag's range must be ordered and within {kind_range:?}: {min} to {max}"
            );
            const KIND: Kind = Kind { what: $what, unit: $unit };
            let (lo, hi) = (min, max);
            StringValueParser::new().try_map(move |text: String| {
                // In range, so the narrowing cannot lose anything.
                check_int(&text, KIND, lo, hi).map(|v| $name($convert(v)))
            })
        }
    };
}

float_kind!(
    /// A duration given in decimal seconds (`0.5`, `60`).
    Seconds(Duration),
    seconds,
    "a number of seconds",
    "",
    Duration::from_secs_f64,
    MAX_DECLARED_SECONDS,
    true
);
float_kind!(
    /// A speed factor: how many times faster than written (`0.5`, `2`); never zero,
    /// which would never play.
    Speed(f64),
    speed,
    "a speed factor",
    "",
    std::convert::identity,
    1e6,
    false
);
float_kind!(
    /// A rate, per second; never zero (nothing would ever happen).
    Rate(f64),
    rate,
    "a rate per second",
    "",
    std::convert::identity,
    1e12,
    false
);
float_kind!(
    /// A percentage.
    Percent(f64),
    percent,
    "a percentage",
    "",
    std::convert::identity,
    100.0,
    true
);

int_kind!(
    /// A duration given in whole microseconds.
    Micros(Duration),
    micros,
    "a whole number of microseconds",
    "",
    Duration::from_micros,
    0,
    u64::MAX
);
int_kind!(
    /// A count of things (messages, threads, rows).
    Count(u64),
    count,
    "a whole number",
    "",
    std::convert::identity,
    0,
    u64::MAX
);
int_kind!(
    /// A size in bytes.
    Bytes(u64),
    bytes,
    "a size in bytes",
    "",
    std::convert::identity,
    0,
    u64::MAX
);
int_kind!(
    /// A `SCHED_FIFO` priority (Linux's are 1 to 99).
    Priority(u8),
    priority,
    "a SCHED_FIFO priority",
    "",
    narrow::<u8>,
    1,
    99
);
int_kind!(
    /// A TCP or UDP port number.
    Port(u16),
    port,
    "a port number",
    "",
    narrow::<u16>,
    0,
    u64::from(u16::MAX)
);

/// A checked whole number as a narrower type; the kind's range fits it (asserted when
/// the parser is made), so nothing is lost.
fn narrow<T: TryFrom<u64> + Default>(v: u64) -> T {
    T::try_from(v).unwrap_or_default()
}

impl Count {
    /// The count as a `usize` (every count's range fits one on the machines ictus runs on;
    /// saturating otherwise).
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl Bytes {
    /// The size as a `usize` (saturating).
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

// ---------------------------------------------------------------------------------
// CPUs
// ---------------------------------------------------------------------------------

/// One CPU this process may run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cpu(usize);

impl Cpu {
    /// The CPU's number.
    pub fn get(self) -> usize {
        self.0
    }
}

/// Where two ends of a measurement run: `none` (where the scheduler puts them), `C`
/// (both on CPU C) or `C,S` (client on C, servers on S).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// `none`: not pinned.
    Unpinned,
    /// Pinned.
    Cpus {
        /// The measuring (client) side's CPU.
        client: usize,
        /// The servers' CPU.
        server: usize,
    },
}

/// The CPUs this process may run on (its affinity), in order; why not, if unreadable.
fn allowed_cpus() -> Result<Vec<usize>, String> {
    let set = sched_getaffinity(None).map_err(|e| format!("cannot read the CPUs this process may run on: {e}"))?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

/// "from 0 to 3", and the list when the set has holes.
fn cpu_range(allowed: &[usize]) -> String {
    let (first, last) = (allowed.first().copied().unwrap_or(0), allowed.last().copied().unwrap_or(0));
    if allowed.len() == last - first + 1 {
        format!("from {first} to {last}")
    } else {
        let list: Vec<String> = allowed.iter().map(usize::to_string).collect();
        format!("from {first} to {last} (this process may run on CPUs {})", list.join(","))
    }
}

/// What a CPU argument's help says of its range, as its refusals say it: e.g.
/// "CPUs 0 to 1 here".
pub fn cpu_range_help() -> String {
    match allowed_cpus() {
        Ok(allowed) if !allowed.is_empty() => {
            let (first, last) = (allowed[0], allowed[allowed.len() - 1]);
            format!("CPUs {first} to {last} here")
        }
        _ => "the CPUs this process may run on".to_string(),
    }
}

/// Checks one CPU number against the CPUs this process may run on.
fn check_cpu(text: &str, kind: Kind, allowed: &[usize]) -> Result<usize, String> {
    let (Some(&first), Some(&last)) = (allowed.first(), allowed.last()) else {
        return Err("this process may run on no CPU".to_string());
    };
    let range = cpu_range(allowed);
    // The bounds first, with the words of every whole number; then the holes.
    let cpu = check_int(text, kind, first as u64, last as u64).map_err(|e| match e.split_once("; ") {
        Some((why, _)) => refusal(why, kind, &range),
        None => e,
    })? as usize;
    if allowed.contains(&cpu) {
        Ok(cpu)
    } else {
        Err(refusal(&format!("CPU {cpu} is not one this process may run on"), kind, &range))
    }
}

const CPU_KIND: Kind = Kind { what: "a CPU this process may run on,", unit: "" };
const PLACEMENT_KIND: Kind = Kind { what: "`none`, a CPU, or client,server CPUs, each", unit: "" };

/// The parser of [`Cpu`]: one CPU this process may run on (its affinity, read when
/// the value is parsed).
pub fn cpu() -> impl TypedValueParser<Value = Cpu> {
    StringValueParser::new().try_map(|text: String| Ok::<_, String>(Cpu(check_cpu(&text, CPU_KIND, &allowed_cpus()?)?)))
}

impl Placement {
    /// Parses `none`, `C` or `C,S`, checking that this process may run on the CPUs.
    pub fn parse(text: &str) -> Result<Placement, String> {
        if text == "none" {
            return Ok(Placement::Unpinned);
        }
        let allowed = allowed_cpus()?;
        let parts: Vec<&str> = text.split(',').collect();
        match parts.as_slice() {
            [both] => {
                let cpu = check_cpu(both, PLACEMENT_KIND, &allowed)?;
                Ok(Placement::Cpus { client: cpu, server: cpu })
            }
            [client, server] => Ok(Placement::Cpus {
                client: check_cpu(client, PLACEMENT_KIND, &allowed)?,
                server: check_cpu(server, PLACEMENT_KIND, &allowed)?,
            }),
            _ => Err(refusal("more than two CPUs", PLACEMENT_KIND, &cpu_range(&allowed))),
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Unpinned => f.write_str("none"),
            Placement::Cpus { client, server } if client == server => write!(f, "{client}"),
            Placement::Cpus { client, server } => write!(f, "{client},{server}"),
        }
    }
}

/// The parser of [`Placement`].
pub fn placement() -> impl TypedValueParser<Value = Placement> {
    StringValueParser::new().try_map(|text: String| Placement::parse(&text))
}

// ---------------------------------------------------------------------------------
// The rules, for the binary and its test
// ---------------------------------------------------------------------------------

/// The value types of this crate's parsers.
fn checked_types() -> [TypeId; 11] {
    [
        TypeId::of::<Seconds>(),
        TypeId::of::<Micros>(),
        TypeId::of::<Speed>(),
        TypeId::of::<Rate>(),
        TypeId::of::<Percent>(),
        TypeId::of::<Count>(),
        TypeId::of::<Bytes>(),
        TypeId::of::<Priority>(),
        TypeId::of::<Port>(),
        TypeId::of::<Cpu>(),
        TypeId::of::<Placement>(),
    ]
}

/// Whether an argument's values go through one of this crate's parsers.
pub fn is_checked(parser: &ValueParser) -> bool {
    checked_types().iter().any(|t| parser.type_id() == *t)
}

/// Whether an argument's values are parsed as a raw integer, float or duration (clap's
/// own parsers, ranged or not): what no ictus argument may do.
pub fn is_raw_number(parser: &ValueParser) -> bool {
    use std::num::*;
    [
        TypeId::of::<u8>(),
        TypeId::of::<u16>(),
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
        TypeId::of::<u128>(),
        TypeId::of::<usize>(),
        TypeId::of::<i8>(),
        TypeId::of::<i16>(),
        TypeId::of::<i32>(),
        TypeId::of::<i64>(),
        TypeId::of::<i128>(),
        TypeId::of::<isize>(),
        TypeId::of::<f32>(),
        TypeId::of::<f64>(),
        TypeId::of::<NonZeroU8>(),
        TypeId::of::<NonZeroU16>(),
        TypeId::of::<NonZeroU32>(),
        TypeId::of::<NonZeroU64>(),
        TypeId::of::<NonZeroUsize>(),
        TypeId::of::<NonZeroI32>(),
        TypeId::of::<NonZeroI64>(),
        TypeId::of::<Duration>(),
    ]
    .iter()
    .any(|t| parser.type_id() == *t)
}

/// The command with every checked argument taking values that start with `-`, so that
/// `-1` and `-inf` reach the parser, which refuses them with the range, instead of
/// being taken for flags. Applies to the whole tree.
pub fn harden(cmd: Command) -> Command {
    cmd.mut_args(|a| if is_checked(a.get_value_parser()) { a.allow_hyphen_values(true) } else { a })
        .mut_subcommands(harden)
}

/// Prints a parse error and returns the exit status: a refused value as one line
/// (clap's first, which names the flag, the value and the range), anything else as
/// clap prints it (usage errors with their usage; `--help` and `--version` on standard
/// output, status 0).
pub fn report_error(e: &clap::Error) -> u8 {
    if e.kind() == ErrorKind::ValueValidation {
        let text = e.to_string();
        eprintln!("{}", text.lines().next().unwrap_or("error: invalid value"));
    } else {
        let _ = e.print();
    }
    u8::try_from(e.exit_code()).unwrap_or(2)
}

#[cfg(test)]
mod tests {
    use clap::{Arg, ArgMatches};

    use super::*;

    /// Parses `value` for `--x` declared with `parser`.
    fn parse<T: Clone + Send + Sync + 'static>(
        parser: impl TypedValueParser<Value = T>,
        value: &str,
    ) -> Result<T, String> {
        let cmd = harden(Command::new("t").arg(Arg::new("x").long("x").value_parser(parser)));
        let m: ArgMatches = cmd.try_get_matches_from(["t", "--x", value]).map_err(|e| e.to_string())?;
        Ok(m.get_one::<T>("x").expect("given").clone())
    }

    const HOSTILE: &[&str] = &[
        "",
        "-1",
        "-0.5",
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
        "0x10",
        " 1",
        "1 ",
        "one",
    ];

    #[test]
    fn every_kind_refuses_every_hostile_value_with_one_line_naming_the_flag_and_range() {
        fn check<T: Clone + Send + Sync + fmt::Debug + 'static>(
            parser: impl TypedValueParser<Value = T>,
            range: (&str, &str),
        ) {
            for v in HOSTILE {
                let err = parse(parser.clone(), v).expect_err(&format!("{v:?} accepted"));
                let first = err.lines().next().expect("a line");
                assert!(first.contains("for '--x <x>'"), "{first}");
                assert_eq!(stated_range(first), Some((range.0.to_string(), range.1.to_string())), "{first}");
            }
        }
        check(seconds(0.001, 86_400.0), ("0.001", "86400"));
        check(speed(0.01, 100.0), ("0.01", "100"));
        check(rate(1.0, 1000.0), ("1", "1000"));
        check(percent(0.0, 100.0), ("0", "100"));
        check(micros(0, 1_000_000), ("0", "1000000"));
        check(count(1, u64::MAX), ("1", "18446744073709551615"));
        check(bytes(2, 16 << 20), ("2", "16777216"));
        check(priority(1, 99), ("1", "99"));
        check(port(1, 65535), ("1", "65535"));
    }

    #[test]
    fn bounds_are_inclusive_and_zero_is_refused_where_out_of_range() {
        assert_eq!(parse(speed(0.01, 100.0), "0.01").map(Speed::get), Ok(0.01));
        assert_eq!(parse(speed(0.01, 100.0), "100").map(Speed::get), Ok(100.0));
        for v in ["0", "0.009", "100.5", "-0.01"] {
            assert!(parse(speed(0.01, 100.0), v).is_err(), "{v}");
        }
        assert_eq!(parse(seconds(0.001, 10.0), "0.25").map(Seconds::get), Ok(Duration::from_millis(250)));
        assert_eq!(parse(micros(0, 10), "0").map(Micros::get), Ok(Duration::ZERO));
        assert_eq!(parse(count(1, 10), "10").map(Count::get), Ok(10));
        for v in ["0", "11", "1.5", "1e1"] {
            assert!(parse(count(1, 10), v).is_err(), "{v}");
        }
        assert_eq!(parse(priority(1, 99), "99").map(Priority::get), Ok(99));
        assert_eq!(parse(port(1, 65535), "65535").map(Port::get), Ok(65535));
        assert_eq!(parse(count(0, u64::MAX), "18446744073709551615").map(Count::get), Ok(u64::MAX));
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        let why = |p, v| parse(p, v).expect_err("refused");
        assert!(why(count(1, 10), "-1").contains(": negative; expected a whole number from 1 to 10"));
        assert!(why(count(1, 10), "1.5").contains(": not a whole number;"));
        assert!(why(count(1, 10), "1e300").contains(": out of range;"));
        assert!(why(count(1, 10), "nan").contains(": not a number;"));
        assert!(why(count(1, 10), "inf").contains(": not finite;"));
        assert!(why(count(1, 10), "").contains(": empty;"));
        let s = |v| parse(speed(0.01, 100.0), v).expect_err("refused");
        assert!(s("-inf").contains(": not finite;"), "{}", s("-inf"));
        assert!(s("-1").contains(": negative; expected a speed factor from 0.01 to 100"), "{}", s("-1"));
        assert!(s("1e308").contains(": out of range;"));
    }

    #[test]
    fn cpus_are_those_this_process_may_run_on() {
        let allowed = allowed_cpus().expect("affinity");
        let first = allowed[0];
        let last = *allowed.last().expect("one");
        assert_eq!(parse(cpu(), &first.to_string()).map(Cpu::get), Ok(first));
        for v in HOSTILE.iter().map(|s| s.to_string()).chain([(last + 1).to_string(), "1000000".into()]) {
            let err = parse(cpu(), &v).expect_err(&v);
            assert_eq!(stated_range(&err), Some((first.to_string(), last.to_string())), "{err}");
        }
        assert_eq!(parse(placement(), "none"), Ok(Placement::Unpinned));
        assert_eq!(parse(placement(), &first.to_string()), Ok(Placement::Cpus { client: first, server: first }));
        assert_eq!(parse(placement(), &format!("{first},{last}")), Ok(Placement::Cpus { client: first, server: last }));
        for v in ["", "x", "0,", ",0", "0,0,0", "-1", "nan", "1e300", "0,-1", "none,0"] {
            let err = parse(placement(), v).expect_err(v);
            assert!(stated_range(&err).is_some(), "{err}");
        }
        assert_eq!(Placement::parse("0,0").map(|p| p.to_string()), Ok("0".to_string()));
        assert_eq!(cpu_range(&[0, 1, 3]), "from 0 to 3 (this process may run on CPUs 0,1,3)");
        assert_eq!(cpu_range(&[2, 3]), "from 2 to 3");
    }

    #[test]
    fn the_rules_tell_checked_from_raw_parsers() {
        assert!(is_checked(&speed(1.0, 2.0).into()));
        assert!(is_checked(&cpu().into()));
        assert!(!is_raw_number(&count(1, 2).into()));
        assert!(is_raw_number(&clap::value_parser!(u64).into()));
        assert!(is_raw_number(&clap::value_parser!(f64).into()));
        assert!(is_raw_number(&clap::value_parser!(u8).range(1..=99).into()));
        assert!(!is_checked(&clap::value_parser!(String)));
        assert!(!is_raw_number(&clap::value_parser!(std::path::PathBuf)));
    }

    #[test]
    #[should_panic(expected = "finite")]
    fn a_flag_cannot_declare_an_infinite_range() {
        let _ = seconds(0.0, f64::INFINITY);
    }

    #[test]
    #[should_panic(expected = "never zero")]
    fn a_speed_cannot_be_zero() {
        let _ = speed(0.0, 2.0);
    }

    #[test]
    fn stated_range_reads_the_last_range() {
        assert_eq!(stated_range("x from a to b; expected y from 1 to 2 bytes"), Some(("1".into(), "2".into())));
        assert_eq!(
            stated_range("expected a CPU from 0 to 3 (this process may run on CPUs 0,1,3)"),
            Some(("0".into(), "3".into()))
        );
        assert_eq!(stated_range("no range"), None);
    }
}
