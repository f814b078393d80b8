//! `ictus display`: the display server and a demo client.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use ictus_args::{Count, Seconds};

/// The largest headless screen side (the server's own limit).
const MAX_SIDE: u16 = 8192;

/// `ictus display …`
#[derive(Args, Debug)]
pub struct DisplayArgs {
    #[command(subcommand)]
    command: DisplayCommand,
}

#[derive(Subcommand, Debug)]
enum DisplayCommand {
    /// Run the display server (002): windows drawn over a socket, ports or shared memory,
    /// shown on an X server through MIT-SHM (or headless); registered as "display".
    Serve {
        /// Headless, into a framebuffer of --width × --height (saved with --png), instead of
        /// an X server.
        #[arg(long, conflicts_with_all = ["display", "no_mit_shm"])]
        headless: bool,
        /// The headless screen's width in pixels, 1 to 8192.
        #[arg(long, value_name = "PIXELS", default_value = "1280", requires = "headless",
              value_parser = ictus_args::count(1, u64::from(MAX_SIDE)))]
        width: Count,
        /// The headless screen's height in pixels, 1 to 8192.
        #[arg(long, value_name = "PIXELS", default_value = "720", requires = "headless",
              value_parser = ictus_args::count(1, u64::from(MAX_SIDE)))]
        height: Count,
        /// The X display [default: $DISPLAY].
        #[arg(long)]
        display: Option<String>,
        /// Do not use MIT-SHM even if the X server has it (plain PutImage).
        #[arg(long)]
        no_mit_shm: bool,
        /// The socket transport's path [default: display.sock beside the name server's socket].
        #[arg(long)]
        socket: Option<PathBuf>,
        /// The name to register under.
        #[arg(long, default_value = "display")]
        name: String,
        /// The name server's socket [default: as for `ictus name-server`].
        #[arg(long)]
        name_server: Option<PathBuf>,
        /// Presents of drawing per second at most, 1 to 1000 (frames are shown at their own
        /// times) [default: 60].
        #[arg(long, value_name = "HZ", value_parser = ictus_args::count(1, 1000))]
        refresh_hz: Option<Count>,
        /// Save the screen as a PNG when stopping.
        #[arg(long)]
        png: Option<PathBuf>,
    },
    /// Draw into a window of a running display server for a while.
    Demo {
        /// socket, port or shm.
        #[arg(long, default_value = "shm")]
        transport: ictus_display::Transport,
        /// How long, in seconds, 0.001 to 86400.
        #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = ictus_args::seconds(0.001, 86_400.0))]
        seconds: Seconds,
        /// The name server's socket [default: as for `ictus name-server`].
        #[arg(long)]
        name_server: Option<PathBuf>,
    },
}

pub fn main(a: DisplayArgs) -> Result<(), Box<dyn std::error::Error>> {
    use ictus_display_server::cli;
    match a.command {
        DisplayCommand::Serve {
            headless,
            width,
            height,
            display,
            no_mit_shm,
            socket,
            name,
            name_server,
            refresh_hz,
            png,
        } => {
            // In range (1 to MAX_SIDE, 1 to 1000), so the narrowing loses nothing.
            let side = |c: Count| u16::try_from(c.get()).unwrap_or(MAX_SIDE);
            cli::serve(cli::ServeOptions {
                headless: headless.then(|| (side(width), side(height))),
                display,
                no_mit_shm,
                socket,
                name: Some(name),
                name_server,
                refresh_hz: refresh_hz.map(|hz| u32::try_from(hz.get()).unwrap_or(1000)),
                png,
            })?
        }
        DisplayCommand::Demo { transport, seconds, name_server } => cli::demo(transport, seconds.get(), name_server)?,
    }
    Ok(())
}
