//! What `ictus display` does: serve, or run a small client against a server.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ictus_display::{monotonic_ns, ConnectOptions, Display, Rect, Transport};
use ictus_ipc::Space;
use ictus_server::serve_until_signalled;

use crate::{Options, Screen};

/// Why `ictus display` failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The server could not start.
    #[error(transparent)]
    Start(#[from] crate::StartError),
    /// The skeleton: registration with the name server, signals.
    #[error(transparent)]
    Serve(#[from] ictus_server::ServeError),
    /// The socket's directory.
    #[error(transparent)]
    Path(#[from] ictus_name_api::socket::PathError),
    /// Signals, files.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// As a client.
    #[error(transparent)]
    Connect(#[from] ictus_display::ConnectError),
    /// As a client.
    #[error(transparent)]
    Display(#[from] ictus_display::DisplayError),
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
}

/// Options of `ictus display serve`.
#[derive(Debug, Default)]
pub struct ServeOptions {
    /// Headless, with this screen size (width, height; each 1 to 8192), instead of an
    /// X server.
    pub headless: Option<(u16, u16)>,
    /// The X display (default `$DISPLAY`).
    pub display: Option<String>,
    /// Do not use MIT-SHM even if the X server has it.
    pub no_mit_shm: bool,
    /// The socket transport's path (default: `display.sock` beside the name server's).
    pub socket: Option<PathBuf>,
    /// The name to register under.
    pub name: Option<String>,
    /// The name server's socket.
    pub name_server: Option<PathBuf>,
    /// Presents of drawing per second at most.
    pub refresh_hz: Option<u32>,
    /// Save the screen as a PNG when stopping.
    pub png: Option<PathBuf>,
}

/// `ictus display serve`: run the server, register it with the name server (again
/// whenever the name server restarts), serve until `SIGINT`/`SIGTERM`.
pub fn serve(o: ServeOptions) -> Result<(), CliError> {
    serve_until_signalled(|stop| {
        let screen = match o.headless {
            Some((width, height)) => {
                if !(1..=8192).contains(&width) || !(1..=8192).contains(&height) {
                    return Err(CliError::Usage(format!("a headless screen of {width}x{height}: sides are 1 to 8192")));
                }
                Screen::Headless { width, height }
            }
            None => Screen::X { display: o.display.clone(), shm: !o.no_mit_shm },
        };
        let socket = match &o.socket {
            Some(p) => p.clone(),
            None => ictus_name_api::socket::prepare_default_socket_path()?.with_file_name("display.sock"),
        };
        let mut opts = Options::headless(0, 0, Some(socket.clone()));
        opts.screen = screen;
        // The presenter asks for SCHED_FIFO (refused: it runs timesharing, said once);
        // the transports stay timesharing. doc/display.md, "Real-time threads".
        opts.realtime = true;
        opts.realtime_transports = false;
        if let Some(hz) = o.refresh_hz {
            opts.refresh_hz = hz;
        }
        let space = Space::task();
        let running = crate::spawn(&space, opts)?;
        let name = o.name.clone().unwrap_or_else(|| ictus_display::SERVICE_NAME.to_owned());
        let names = running.register(&name, o.name_server.as_deref()).map_err(ictus_server::ServeError::from)?;
        let how = match running.x() {
            Some(x) if x.has_shm() => "an X server, MIT-SHM",
            Some(_) => "an X server, PutImage (no MIT-SHM)",
            None => "headless",
        };
        eprintln!(
            "ictus display: registered as {name:?}; shown on {how}; socket {} (pid {})",
            socket.display(),
            std::process::id()
        );
        let mut b = [0u8; 1];
        let _ = rustix::io::read(stop, &mut b);
        // The registration would vanish with the port anyway; say goodbye first.
        names.stop();
        if let Some(p) = &o.png {
            running.save_png(p)?;
            eprintln!("ictus display: saved the screen to {}", p.display());
        }
        let s = running.stats();
        running.stop();
        eprintln!(
            "ictus display: stopped ({} clients, {} presents, {} frames shown, {} dropped, {} cut off)",
            s.clients, s.presents, s.frames_shown, s.frames_dropped, s.cut_off
        );
        Ok(())
    })
}

/// `ictus display demo`: a client that shows what the server does for `how_long`:
/// munching squares, scrolling text and a moving frame, over `transport`.
pub fn demo(transport: Transport, how_long: Duration, name_server: Option<PathBuf>) -> Result<(), CliError> {
    let mut o = ConnectOptions::new(transport);
    o.name_server = name_server;
    let mut d = Display::connect(&o)?;
    let w = d.create_window(None, Rect::new(0, 0, 512, 320), 0x000020)?;
    d.set_title(w, &format!("ictus display demo ({})", transport.name()))?;
    let end = Instant::now() + how_long;
    let mut k = 0u32;
    let mut iters = 0u64;
    while Instant::now() < end {
        for i in 0..256i16 {
            d.fill_rect(w, Rect::new(i, (i ^ (k as i16 & 0xff)) % 256, 1, 1), 0xffffff)?;
        }
        d.copy_area(w, Rect::new(256, 8, 256, 248), 256, 0)?;
        d.text(w, 256, 248, 0x00ff00, Some(0), format!("frame {k:6} over {}", transport.name()).as_bytes())?;
        let mut f = d.frame(128, 64)?;
        for (i, px) in f.pixels().chunks_exact_mut(4).enumerate() {
            let v = ((i as u32 / 4 + k * 3) & 0xff) * 0x010001;
            px.copy_from_slice(&v.to_le_bytes());
        }
        f.present(w, 64, 256, monotonic_ns() + 5_000_000, k)?;
        d.sync()?;
        let _ = d.pending_events()?.count();
        k += 1;
        iters += 1;
        std::thread::sleep(Duration::from_millis(16));
    }
    d.sync_shown()?;
    println!("{iters} iterations over {}", transport.name());
    Ok(())
}
