//! `ictus tactus` (the media synchronization server) and `ictus play` (its player).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use ictus_args::{Count, Seconds, Speed};

/// `ictus tactus …`
#[derive(Args, Debug)]
pub struct TactusArgs {
    #[command(subcommand)]
    command: TactusCommand,
}

#[derive(Subcommand, Debug)]
enum TactusCommand {
    /// Run the Tactus server (000 §7): timestamped streams sent ahead of real time,
    /// delivered to the display, audio sinks and MIDI devices on time; registered as "tactus".
    Serve {
        /// The name server's socket [default: as for `ictus name-server`].
        #[arg(long)]
        name_server: Option<PathBuf>,
        /// The name to register under.
        #[arg(long, default_value = "tactus")]
        name: String,
        /// Also serve the socket transport at this path (for comparison with shared memory).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Do not ask for real-time priority.
        #[arg(long)]
        timesharing: bool,
    },
    /// Print the server's counters as JSON.
    Status {
        /// The name server's socket [default: as for `ictus name-server`].
        #[arg(long)]
        name_server: Option<PathBuf>,
        /// The name it is registered under.
        #[arg(long, default_value = "tactus")]
        name: String,
    },
    /// Write a small clip (clip.y4m, clip.wav, clip.mid) into a directory, for `ictus play`.
    MakeClip {
        /// The directory.
        dir: PathBuf,
        /// Seconds of clip (1 to 3600).
        #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = ictus_args::count(1, 3600))]
        seconds: Count,
        /// Width and height, e.g. 160x120.
        #[arg(long, default_value = "160x120")]
        size: String,
        /// Frames per second (1 to 240).
        #[arg(long, value_name = "FPS", default_value = "10", value_parser = ictus_args::count(1, 240))]
        fps: Count,
    },
}

/// `ictus play …`
#[derive(Args, Debug)]
pub struct PlayArgs {
    /// A clip: a directory with .y4m/.wav/.mid files, one of them, or a compressed
    /// file (MP4, MKV, WebM…) decoded by GStreamer.
    path: PathBuf,
    /// The name server's socket [default: as for `ictus name-server`].
    #[arg(long)]
    name_server: Option<PathBuf>,
    /// Where video goes.
    #[arg(long, default_value = "display")]
    video: String,
    /// Where audio goes (its clock leads): wav:PATH[,skew=PPM][,buffer=MS], wav:- discards.
    #[arg(long, default_value = "wav:-")]
    audio: String,
    /// Where MIDI goes.
    #[arg(long, default_value = "cable:ictus-play")]
    midi: String,
    /// Stop after this many seconds of the clip (0.001 to 86400).
    #[arg(long, value_name = "SECONDS", value_parser = ictus_args::seconds(0.001, 86_400.0))]
    seconds: Option<Seconds>,
    /// Start this far into the clip, in seconds (0 to 86400).
    #[arg(long, value_name = "SECONDS", default_value = "0", value_parser = ictus_args::seconds(0.0, 86_400.0))]
    start: Seconds,
    /// Play this many times faster than written (0.25 to 4; ↑ and ↓ double and halve it).
    #[arg(long, value_name = "FACTOR", default_value = "1", value_parser = ictus_args::speed(0.25, 4.0))]
    rate: Speed,
}

pub fn main(a: TactusArgs) -> Result<(), Box<dyn std::error::Error>> {
    use ictus_tactus_server::cli;
    match a.command {
        TactusCommand::Serve { name_server, name, socket, timesharing } => {
            cli::serve(cli::ServeOptions { name_server, name: Some(name), socket, timesharing })?
        }
        TactusCommand::Status { name_server, name } => cli::status(name_server, Some(name))?,
        TactusCommand::MakeClip { dir, seconds, size, fps } => {
            let (w, h) = size
                .split_once('x')
                .and_then(|(w, h)| Some((w.parse::<u16>().ok()?, h.parse::<u16>().ok()?)))
                .filter(|(w, h)| *w >= 2 && *h >= 2 && w % 2 == 0 && h % 2 == 0)
                .ok_or_else(|| format!("size {size:?}: WIDTHxHEIGHT, even numbers"))?;
            // In range (checked by kind), so both fit.
            let (seconds, fps) = (seconds.get() as u32, fps.get() as u32);
            ictus_tactus_server::play::make_clip(&dir, seconds, w, h, fps)?;
            println!("{}", dir.display());
        }
    }
    Ok(())
}

/// `ictus play …`; `quiet` is the global `-q`/`--quiet`: no keys and no status line,
/// a summary on standard output at the end.
pub fn play(a: PlayArgs, quiet: bool) -> Result<(), Box<dyn std::error::Error>> {
    use ictus_tactus_server::play;
    let mut o = play::PlayOptions::new(a.path);
    o.name_server = a.name_server;
    o.video = a.video;
    o.audio = a.audio;
    o.midi = a.midi;
    o.seconds = a.seconds.map(Seconds::get);
    o.start = a.start.get();
    o.rate = a.rate.get();
    o.quiet = quiet;
    o.interactive = !quiet;
    let r = play::play(&o)?;
    if quiet {
        let s = &r.status;
        let late: u64 = s.streams.iter().map(|x| x.late).sum();
        let dropped: u64 = s.streams.iter().map(|x| x.dropped).sum();
        println!("sent video {} audio {} midi {}; late {late}, dropped {dropped}", r.sent[0], r.sent[1], r.sent[2]);
    }
    Ok(())
}
