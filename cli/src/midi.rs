//! `ictus midi …`: decode captures, play and conduct Standard MIDI Files, make the demo
//! file, list devices. The code is in `ictus-midi`; this is the command line.
//!
//! # `ictus midi decode` output
//!
//! One JSON object per line and per message:
//!
//! ```text
//! {"t":640000,"kind":"note_on","channel":0,"bytes":[144,60,100]}
//! ```
//!
//! - `t`: nanoseconds. From a file or standard input, the byte offset of the message's
//!   first byte × 320 000 (320 µs, a byte's time on a MIDI line at 31250 baud): the time
//!   it would have arrived had the capture been sent at the wire's full speed. With
//!   `--arrival`, and always with `--device`, the `CLOCK_MONOTONIC` time at which the
//!   bytes were read (boot-relative, as the input server stamps them).
//! - `kind`: `note_off`, `note_on`, `poly_pressure`, `control_change`, `program_change`,
//!   `channel_pressure`, `pitch_bend`, `sysex`, `sysex_unterminated`,
//!   `time_code_quarter_frame`, `song_position`, `song_select`, `tune_request`, `clock`,
//!   `start`, `continue`, `stop`, `active_sensing`, `reset`.
//! - `channel` (channel messages only): 0–15.
//! - `bytes`: the message, status byte first (also where the wire used running status).
//! - `overflow` (only when non-zero): sysex bytes dropped past `--max-sysex`.
//!
//! A summary of what was dropped goes to standard error at the end.

use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ictus_args::{Bytes, Count, Seconds, Speed};
use ictus_midi::device::{Device, DeviceSpec};
use ictus_midi::output::{Close, Output, OutputOptions};
use ictus_midi::parse::{Message, Parser, Stats};
use ictus_midi::play::{self, ConductEvent};
use ictus_midi::smf::{Score, Strictness};
use ictus_rt::Time;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The time of a byte on the wire, for `decode` of files.
const WIRE_NANOS_PER_BYTE: u64 = 320_000;

/// `--max-sysex`'s default, [`ictus_midi::parse::DEFAULT_MAX_SYSEX`] as the command line
/// writes it.
const DEFAULT_MAX_SYSEX_TEXT: &str = "65536";
/// The largest `--max-sysex`: what one message may make the decoder hold.
const MAX_SYSEX_LIMIT: u64 = 16 << 20;

#[derive(clap::Args, Debug)]
pub struct MidiArgs {
    #[command(subcommand)]
    command: MidiCommand,
}

#[derive(clap::Subcommand, Debug)]
enum MidiCommand {
    /// Decode raw MIDI bytes (a file, standard input or a device) into one JSON object
    /// per message: {"t":NANOS,"kind":…,"bytes":[…]}; t is the byte offset × 320 µs for
    /// files and standard input, the arrival time (CLOCK_MONOTONIC) with --arrival or
    /// --device. A summary of dropped bytes goes to standard error.
    Decode(DecodeArgs),
    /// Play a Standard MIDI File (formats 0 and 1, tempo map, all tracks) through the
    /// output library.
    Play(PlayArgs),
    /// Conduct a Standard MIDI File: the tempo follows taps (any key in the terminal, or
    /// note-ons from --tap-device). The first tap starts the music.
    Conduct(ConductArgs),
    /// Write the small demo MIDI file that ictus makes itself.
    MakeDemo {
        /// Where to write it.
        out: PathBuf,
    },
    /// List the MIDI devices of this machine.
    Devices,
    /// The MIDI timing monitor (000 Figure 1): interarrival times drawn live, one row per
    /// millisecond, and written as SVG.
    Monitor(ictus_midi_server::cli::MonitorArgs),
}

#[derive(clap::Args, Debug)]
struct DecodeArgs {
    /// The capture to read [default: standard input; `-` is standard input too].
    file: Option<PathBuf>,
    /// Read from a device instead (cable:NAME takes the receiving end of a cable).
    #[arg(long, conflicts_with = "file")]
    device: Option<String>,
    /// Stamp messages with their arrival time (CLOCK_MONOTONIC) instead of offset × 320 µs.
    #[arg(long)]
    arrival: bool,
    /// Keep at most this many bytes of a sysex message, F0 and F7 included (2 to 16777216).
    #[arg(long, value_name = "BYTES", default_value = DEFAULT_MAX_SYSEX_TEXT, value_parser = ictus_args::bytes(2, MAX_SYSEX_LIMIT))]
    max_sysex: Bytes,
    /// Stop after this many messages (1 to 18446744073709551615).
    #[arg(long, value_name = "N", value_parser = ictus_args::count(1, u64::MAX))]
    count: Option<Count>,
    /// With --device: stop after this many seconds without input (0.001 to 86400).
    #[arg(long, value_name = "SECONDS", requires = "device", value_parser = ictus_args::seconds(0.001, 86_400.0))]
    idle_timeout: Option<Seconds>,
}

#[derive(clap::Args, Debug)]
struct OutputArgs {
    /// Where to send: cable:NAME[,paced], /dev/snd/midiCxDy, serial:/dev/ttyX[,BAUD].
    #[arg(long, default_value = "cable:ictus")]
    device: String,
    /// Run the output threads timesharing instead of asking for SCHED_FIFO.
    #[arg(long)]
    timesharing: bool,
    /// Run a timer thread on every CPU, racing for each due message: on a virtual
    /// machine, a message due while the host has stopped one virtual CPU goes out from
    /// another.
    #[arg(long)]
    timer_per_cpu: bool,
}

#[derive(clap::Args, Debug)]
struct PlayArgs {
    /// The Standard MIDI File.
    file: PathBuf,
    #[command(flatten)]
    output: OutputArgs,
    /// Play this many times faster than written (0.01 to 100).
    #[arg(long, value_name = "FACTOR", default_value = "1", value_parser = ictus_args::speed(0.01, 100.0))]
    speed: Speed,
    /// Play what there is of a damaged file (cut short, without End of Track, …) with a
    /// warning for each problem, instead of refusing it.
    #[arg(long)]
    lenient: bool,
}

#[derive(clap::Args, Debug)]
struct ConductArgs {
    /// The Standard MIDI File.
    file: PathBuf,
    #[command(flatten)]
    output: OutputArgs,
    /// Take taps (note-ons) from this MIDI input instead of the terminal.
    #[arg(long)]
    tap_device: Option<String>,
    /// Conduct what there is of a damaged file, with a warning for each problem.
    #[arg(long)]
    lenient: bool,
}

pub fn main(args: MidiArgs) -> Result<()> {
    match args.command {
        MidiCommand::Decode(a) => decode(a),
        MidiCommand::Play(a) => play_file(a),
        MidiCommand::Conduct(a) => conduct(a),
        MidiCommand::MakeDemo { out } => {
            ictus_midi::smf::write_demo(&out)?;
            eprintln!("ictus midi: wrote the demo piece to {}", out.display());
            Ok(())
        }
        MidiCommand::Monitor(a) => ictus_midi_server::cli::monitor(a).map_err(Into::into),
        MidiCommand::Devices => {
            println!("{}", ictus_midi::device::rawmidi::present());
            println!("virtual cables: always available as cable:NAME (add ,paced for 31250 baud)");
            Ok(())
        }
    }
}

/// One message as a JSON object, keys in the documented order (`t` first). Kind names
/// are fixed identifiers and the rest are numbers, so nothing needs escaping.
fn json_line(m: &Message) -> String {
    let mut s = format!("{{\"t\":{},\"kind\":\"{}\"", m.time().as_nanos(), m.kind().name());
    if let Some(ch) = m.channel() {
        s.push_str(&format!(",\"channel\":{ch}"));
    }
    s.push_str(",\"bytes\":[");
    for (i, b) in m.bytes().iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&b.to_string());
    }
    s.push(']');
    if m.overflow() > 0 {
        s.push_str(&format!(",\"overflow\":{}", m.overflow()));
    }
    s.push('}');
    s
}

fn summary(st: &Stats) -> String {
    format!(
        "{} messages from {} bytes; {} bytes dropped (stray data {}, undefined status {}, stray F7 {}, incomplete {}, sysex overflow {}); {} unterminated sysex; {} status bytes supplied by running status",
        st.messages,
        st.bytes,
        st.dropped(),
        st.stray_data,
        st.undefined,
        st.stray_eox,
        st.incomplete,
        st.sysex_overflow,
        st.sysex_unterminated,
        st.running_status,
    )
}

fn decode(a: DecodeArgs) -> Result<()> {
    let mut parser = Parser::with_max_sysex(a.max_sysex.as_usize());
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let limit = a.count.map_or(u64::MAX, Count::get);
    let mut emitted = 0u64;
    // Writes one line; says whether the count is reached.
    let mut emit = |m: Message, out: &mut dyn Write| -> Result<bool> {
        writeln!(out, "{}", json_line(&m))?;
        emitted += 1;
        Ok(emitted >= limit)
    };
    if let Some(spec) = &a.device {
        let mut dev = DeviceSpec::parse(spec)?.open_input()?;
        eprintln!("ictus midi decode: reading {}", dev.describe());
        let idle = a.idle_timeout.map(Seconds::get);
        let mut buf = vec![0u8; ictus_midi::device::cable::MAX_DATAGRAM];
        'read: loop {
            let n = match dev.read(&mut buf, idle) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => break,
                Err(e) => return Err(format!("{}: {e}", dev.describe()).into()),
            };
            let t = ictus_rt::clock::now();
            for &b in &buf[..n] {
                for m in parser.feed(b, t) {
                    if emit(m, &mut out)? {
                        break 'read;
                    }
                }
            }
            out.flush()?;
        }
    } else {
        let mut input: Box<dyn Read> = match &a.file {
            None => Box::new(std::io::stdin().lock()),
            Some(p) if p.as_os_str() == "-" => Box::new(std::io::stdin().lock()),
            Some(p) => Box::new(std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?),
        };
        let mut buf = vec![0u8; 64 * 1024];
        let mut offset = 0u64;
        let mut stopped = false;
        'file: loop {
            let n = match input.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            let arrival = ictus_rt::clock::now();
            for &b in &buf[..n] {
                let t = if a.arrival { arrival } else { Time::from_nanos(offset.saturating_mul(WIRE_NANOS_PER_BYTE)) };
                offset += 1;
                for m in parser.feed(b, t) {
                    if emit(m, &mut out)? {
                        stopped = true;
                        break 'file;
                    }
                }
            }
        }
        if !stopped {
            if let Some(m) = parser.finish() {
                emit(m, &mut out)?;
            }
        }
    }
    out.flush()?;
    eprintln!("ictus midi decode: {}", summary(&parser.stats()));
    Ok(())
}

fn open_output(o: &OutputArgs) -> Result<Output> {
    let spec = DeviceSpec::parse(&o.device)?;
    let device = spec.open_output()?;
    let mut options = if o.timesharing { OutputOptions::timesharing() } else { OutputOptions::default() };
    if o.timer_per_cpu {
        options = options.with_timer_per_cpu();
    }
    Ok(Output::open(device, options)?)
}

fn report_closed(closed: &ictus_midi::output::Closed, device: &str) {
    let s = &closed.stats;
    eprintln!(
        "ictus midi: sent {} messages ({} bytes) to {device}; {} late, {} out of order, {} retries on a full device, {} discarded, {} write errors",
        s.sent, s.bytes, s.late, s.out_of_order, s.full_retries, s.discarded, s.write_errors
    );
    if let Some(e) = &s.last_error {
        eprintln!("ictus midi: last device error: {e}");
    }
    let lost = closed.device.as_ref().map_or(0, |d| d.lost_bytes());
    if lost > 0 {
        eprintln!(
            "ictus midi: note: {lost} bytes went nowhere: no receiver held {device} (start one first, e.g. `ictus midi decode --device {device}`)"
        );
    }
}

/// The score in `path`: a damaged file is refused, saying that `--lenient` plays what is
/// there, or with `lenient` played with a warning per problem.
fn load_score(path: &Path, lenient: bool) -> Result<Score> {
    let strictness = if lenient { Strictness::Lenient } else { Strictness::Strict };
    let score = Score::load_with(path, strictness).map_err(|e| -> Box<dyn std::error::Error> {
        if e.lenient_would_play() {
            format!("{e}; --lenient plays what is there").into()
        } else {
            e.into()
        }
    })?;
    for p in &score.problems {
        eprintln!("ictus midi: warning: {}: {p}; playing what is there", path.display());
    }
    Ok(score)
}

fn play_file(a: PlayArgs) -> Result<()> {
    let score = load_score(&a.file, a.lenient)?;
    let out = open_output(&a.output)?;
    let speed = a.speed.get();
    eprintln!(
        "ictus midi play: {} messages, format {}, {} tracks, {:.1} s at {speed}× speed, on {}",
        score.events.len(),
        score.format,
        score.tracks,
        score.duration().as_secs_f64() / speed,
        out.device()
    );
    let start = ictus_rt::clock::now() + Duration::from_millis(100);
    play::play(&score, &out, start, speed)?;
    let closed = out.close(Close::Drain);
    report_closed(&closed, &a.output.device);
    Ok(())
}

fn conduct(a: ConductArgs) -> Result<()> {
    let score = load_score(&a.file, a.lenient)?;
    let (taps, tap_thread) = match &a.tap_device {
        Some(spec) => {
            let dev = DeviceSpec::parse(spec)?.open_input()?;
            eprintln!("ictus midi conduct: tap note-ons on {}; the first starts the music", dev.describe());
            play::device_taps(dev)?
        }
        None => {
            let t = play::terminal_taps()?;
            eprintln!("ictus midi conduct: tap any key to beat time (the first starts the music); q to stop\r");
            t
        }
    };
    let out = open_output(&a.output)?;
    let mut stopped = false;
    let n = play::conduct(&score, &out, &taps, |e| match e {
        ConductEvent::Tap { bpm, beat } => eprint!("\rbeat {beat:7.2}   tempo {bpm:6.1} beats a minute   "),
        ConductEvent::Stopped => stopped = true,
    })?;
    drop(tap_thread);
    eprintln!();
    let closed = out.close(if stopped { Close::Discard } else { Close::Drain });
    eprintln!(
        "ictus midi conduct: {n} of {} messages conducted{}",
        score.events.len(),
        if stopped { " (stopped)" } else { "" }
    );
    report_closed(&closed, &a.output.device);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_max_sysex_default_is_the_parsers() {
        assert_eq!(DEFAULT_MAX_SYSEX_TEXT.parse::<usize>(), Ok(ictus_midi::parse::DEFAULT_MAX_SYSEX));
        assert!(ictus_midi::parse::DEFAULT_MAX_SYSEX as u64 <= MAX_SYSEX_LIMIT);
    }
}
