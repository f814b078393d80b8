//! `ictus display`: the display server and a demo client.

use std::path::PathBuf;

use clap::{Args, Subcommand};

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
        /// Headless, on a screen of this size (e.g. 1280x720), instead of an X server.
        #[arg(long)]
        headless: Option<String>,
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
        /// Presents of drawing per second at most (frames are shown at their own times).
        #[arg(long)]
        refresh_hz: Option<u32>,
        /// Save the screen as a PNG when stopping.
        #[arg(long)]
        png: Option<PathBuf>,
    },
    /// Draw into a window of a running display server for a while.
    Demo {
        /// socket, port or shm.
        #[arg(long, default_value = "shm")]
        transport: ictus_display::Transport,
        /// How long.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// The name server's socket [default: as for `ictus name-server`].
        #[arg(long)]
        name_server: Option<PathBuf>,
    },
}

pub fn main(a: DisplayArgs) -> Result<(), Box<dyn std::error::Error>> {
    use ictus_display_server::cli;
    match a.command {
        DisplayCommand::Serve { headless, display, no_mit_shm, socket, name, name_server, refresh_hz, png } => {
            cli::serve(cli::ServeOptions {
                headless,
                display,
                no_mit_shm,
                socket,
                name: Some(name),
                name_server,
                refresh_hz,
                png,
            })?
        }
        DisplayCommand::Demo { transport, seconds, name_server } => cli::demo(transport, seconds, name_server)?,
    }
    Ok(())
}
