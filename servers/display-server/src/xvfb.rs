//! A private X server for tests and experiments: Debian's `Xvfb`, on a display number
//! it picks itself (`-displayfd`), listening on no TCP port, stopped on drop.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use ictus_bench::sys::GuardedCommand;
use rustix::process::Signal;
use std::time::{Duration, Instant};

/// A running Xvfb.
#[derive(Debug)]
pub struct Xvfb {
    child: Child,
    display: String,
}

/// Why Xvfb could not be started.
#[derive(Debug, thiserror::Error)]
pub enum XvfbError {
    /// The program is not there.
    #[error("Xvfb is not installed (Debian package xvfb; scripts/setup.sh installs it): {0}")]
    Missing(std::io::Error),
    /// It started but did not say its display.
    #[error("Xvfb did not start: {0}")]
    NoDisplay(String),
}

impl Xvfb {
    /// Start one with a `width × height` 24-bit screen; returns once it accepts
    /// connections.
    pub fn start(width: u16, height: u16) -> Result<Xvfb, XvfbError> {
        // It dies with the thread that starts it (PR_SET_PDEATHSIG), so that a test
        // killed midway leaves no Xvfb behind.
        let mut cmd = GuardedCommand::new("Xvfb", Signal::TERM);
        // -noreset: an X server resets when its last client leaves, and refuses
        // connections meanwhile; a test or an experiment opens and closes many.
        cmd.command()
            .args(["-displayfd", "1", "-nolisten", "tcp", "-noreset", "-screen", "0"])
            .arg(format!("{width}x{height}x24"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().map_err(XvfbError::Missing)?;
        let out = child.stdout.take().expect("piped");
        // -displayfd writes the number once the server listens.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let line = loop {
            if let Ok(l) = rx.recv_timeout(Duration::from_millis(50)) {
                break l;
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(XvfbError::NoDisplay(format!("it exited with {status}")));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(XvfbError::NoDisplay("no display number within 30 s".into()));
            }
        };
        let n: u32 = line.trim().parse().map_err(|_| XvfbError::NoDisplay(format!("it said {line:?}")))?;
        let x = Xvfb { child, display: format!(":{n}") };
        // Until a connection completes its set-up: a client connecting in the same
        // instant has been seen to be hung up on.
        let mut last = String::new();
        while Instant::now() < deadline {
            match x11rb::rust_connection::RustConnection::connect(Some(&x.display)) {
                Ok(_) => return Ok(x),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(XvfbError::NoDisplay(format!("{} never accepted a connection: {last}", x.display)))
    }

    /// The X server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The display name, for `DISPLAY` or [`crate::Screen::X`].
    pub fn display(&self) -> &str {
        &self.display
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
