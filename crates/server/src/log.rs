//! Logs: `tracing` events from every server and the `ictus` command, written to
//! standard error (which systemd sends to the journal) one line each.
//!
//! - **Levels.** `RUST_LOG` chooses, as everywhere in Rust (`RUST_LOG=ictus_server=debug`);
//!   without it the command's `-v`/`-q` do: info by default, `-v` debug, `-vv` trace,
//!   `-q` warnings, `-qq` errors only.
//! - **Lines.** Each line is `ictus SERVER: message` (or `ictus: message` for what no
//!   server said), the wording people and tests read; the event's structured fields
//!   (`port`, `name`, `client`, `pid`, `path`, …) follow in braces from `-v` on, and
//!   `ICTUS_LOG_FORMAT=json` writes every event as one JSON object with all its fields,
//!   for a log collector.
//! - **Real-time paths log nothing directly**: formatting and writing a line can take
//!   milliseconds. They record fixed-size events in a preallocated ring
//!   ([`crate::rtlog`]) that a thread of their own drains into these logs.

use std::fmt::Write as _;
use std::io::IsTerminal as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// The environment variable that selects the JSON format (`ICTUS_LOG_FORMAT=json`).
pub const FORMAT_ENV: &str = "ICTUS_LOG_FORMAT";

/// The level `-v`/`-q` ask for: `verbosity` is the count of `-v` minus the count of `-q`.
pub fn level_for(verbosity: i8) -> Level {
    match verbosity {
        i8::MIN..=-2 => Level::ERROR,
        -1 => Level::WARN,
        0 => Level::INFO,
        1 => Level::DEBUG,
        _ => Level::TRACE,
    }
}

/// The filter: `RUST_LOG` if set (and valid), else everything at `level_for(verbosity)`.
pub fn filter(verbosity: i8) -> EnvFilter {
    let default = level_for(verbosity);
    match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            eprintln!("ictus: RUST_LOG={spec:?} is not a valid filter ({e}); logging at {default}");
            EnvFilter::new(default.as_str())
        }),
        _ => EnvFilter::new(default.as_str()),
    }
}

/// Install the process's logger: standard error, `RUST_LOG` or `verbosity`, lines or
/// JSON. Call once, early; a second call (or another logger already installed) changes
/// nothing.
pub fn init(verbosity: i8) {
    let json = std::env::var(FORMAT_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter(verbosity)).with_writer(std::io::stderr);
    let _ = if json {
        builder.json().flatten_event(true).with_current_span(false).try_init()
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).event_format(Lines { fields: verbosity > 0 }).try_init()
    };
}

/// The line format: `ictus SERVER: message`, fields in braces when asked for.
#[derive(Debug, Clone, Copy)]
pub struct Lines {
    /// Append the event's structured fields.
    pub fields: bool,
}

/// What one event says: its message, the server that said it, its other fields.
#[derive(Default)]
struct Collect {
    message: String,
    server: Option<String>,
    fields: String,
}

impl Visit for Collect {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message.push_str(value),
            "server" => self.server = Some(value.to_owned()),
            name => {
                let _ = write!(self.fields, " {name}={value:?}");
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.message, "{value:?}");
            }
            "server" => self.server = Some(format!("{value:?}").trim_matches('"').to_owned()),
            name => {
                let _ = write!(self.fields, " {name}={value:?}");
            }
        }
    }
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, _cx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> std::fmt::Result {
        let mut c = Collect::default();
        event.record(&mut c);
        let level = *event.metadata().level();
        match &c.server {
            Some(s) => write!(w, "ictus {s}")?,
            None => write!(w, "ictus")?,
        }
        // Info is the ordinary line; other levels say what they are.
        if level != Level::INFO {
            write!(w, " [{}]", level.as_str().to_ascii_lowercase())?;
        }
        write!(w, ": {}", c.message)?;
        if self.fields && !c.fields.is_empty() {
            write!(w, " {{{} }}", c.fields)?;
        }
        writeln!(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer into a shared buffer, for the format's tests.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn capture(fields: bool, level: Level, f: impl FnOnce()) -> String {
        let buf = Buf::default();
        let b = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(move || b.clone())
            .with_ansi(false)
            .event_format(Lines { fields })
            .finish();
        tracing::subscriber::with_default(sub, f);
        let out = buf.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn lines_keep_the_wording_and_add_fields_when_asked() {
        let out = capture(false, Level::INFO, || {
            tracing::info!(server = "clock-server", name = "clock", pid = 7u32, "registered \"clock\" again");
            tracing::debug!(server = "clock-server", "not at info");
            tracing::warn!("no server");
        });
        assert_eq!(out, "ictus clock-server: registered \"clock\" again\nictus [warn]: no server\n");
        let out = capture(true, Level::DEBUG, || {
            tracing::info!(server = "name-server", port = 3u32, "serving");
            tracing::debug!(server = "name-server", client = 42u64, "a call");
        });
        assert_eq!(out, "ictus name-server: serving { port=3 }\nictus name-server [debug]: a call { client=42 }\n");
    }

    #[test]
    fn verbosity_maps_to_levels() {
        assert_eq!(level_for(0), Level::INFO);
        assert_eq!(level_for(-1), Level::WARN);
        assert_eq!(level_for(-5), Level::ERROR);
        assert_eq!(level_for(1), Level::DEBUG);
        assert_eq!(level_for(3), Level::TRACE);
    }
}
