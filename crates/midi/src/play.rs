//! Playing a [`Score`] through the output library: at the file's tempo ([`play`]) or
//! following taps ([`conduct`]).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ictus_rt::Time;

use crate::conduct::Follower;
use crate::device::Device;
use crate::output::{Output, PutError};
use crate::parse::{Kind, Parser};
use crate::smf::Score;

/// How far ahead of its time a conducted message is handed to the output library. Short,
/// so that a tap changes the time of everything after it; long enough that a message is
/// queued before it is due even when this thread is a little late.
pub const CONDUCT_HORIZON: Duration = Duration::from_millis(30);

/// Queue every event of `score` on `out`, the score's start at `start`, `speed` times
/// as fast as written (1.0: the file's tempo; values are clamped to `[0.01, 100]`).
/// Returns how many messages were queued. The output sends each at its time; close it
/// with [`crate::output::Close::Drain`] to wait for the end.
pub fn play(score: &Score, out: &Output, start: Time, speed: f64) -> Result<usize, PutError> {
    let speed = if speed.is_finite() { speed.clamp(0.01, 100.0) } else { 1.0 };
    let mut n = 0;
    for (at, m) in score.timed() {
        out.put(m.clone(), start + at.div_f64(speed))?;
        n += 1;
    }
    Ok(n)
}

/// What happens during conducting, for a caller that shows it.
#[derive(Clone, Debug, PartialEq)]
pub enum ConductEvent {
    /// A tap was taken: the follower's tempo (beats a minute) and score position (beats).
    Tap {
        /// Smoothed tempo.
        bpm: f64,
        /// Score position at the tap.
        beat: f64,
    },
    /// The taps' source ended or asked to stop: the rest of the score is dropped.
    Stopped,
}

/// A source of taps: times (`CLOCK_MONOTONIC`) sent on a channel; a closed channel
/// means "stop".
pub type Taps = Receiver<Time>;

/// Conduct `score` on `out`: wait for the first tap, then hand each event to the output
/// [`CONDUCT_HORIZON`] before the time the [`Follower`] gives its beat, taking taps as
/// they come. Times handed out never go backwards (a tap that speeds the score up cannot
/// make a later event earlier than one already queued). Returns how many messages were
/// queued; `report` is told of each tap.
pub fn conduct(
    score: &Score,
    out: &Output,
    taps: &Taps,
    mut report: impl FnMut(ConductEvent),
) -> Result<usize, PutError> {
    let initial = Duration::from_micros(u64::from(score.tempo.tempo_at(0)));
    let mut follower = Follower::new(initial);
    let take = |f: &mut Follower, t: Time, report: &mut dyn FnMut(ConductEvent)| {
        f.tap(t);
        report(ConductEvent::Tap { bpm: f.bpm(), beat: f.position(t) });
    };
    match taps.recv() {
        Ok(t) => take(&mut follower, t, &mut report),
        Err(_) => {
            report(ConductEvent::Stopped);
            return Ok(0);
        }
    }
    let mut last_put = Time::ZERO;
    let mut n = 0;
    for e in &score.events {
        let beat = score.tempo.beats_of(e.tick);
        // The follower has started (the first tap came), so it always gives a time.
        while let Some(at) = follower.time_of(beat) {
            let at = at.max(last_put);
            let now = ictus_rt::clock::now();
            if at <= now + CONDUCT_HORIZON {
                out.put(e.message.clone(), at)?;
                last_put = at;
                n += 1;
                break;
            }
            let wait = at.saturating_duration_since(now + CONDUCT_HORIZON);
            match taps.recv_timeout(wait) {
                Ok(t) => take(&mut follower, t, &mut report),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    report(ConductEvent::Stopped);
                    return Ok(n);
                }
            }
        }
    }
    Ok(n)
}

/// A thread producing taps; dropping it stops the thread (within 100 ms) and, for the
/// terminal, puts the terminal back as it was.
#[derive(Debug)]
pub struct TapThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    restore: Option<(OwnedFd, rustix::termios::Termios)>,
}

impl Drop for TapThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        if let Some((fd, t)) = self.restore.take() {
            let _ = rustix::termios::tcsetattr(&fd, rustix::termios::OptionalActions::Now, &t);
        }
    }
}

/// Taps from a MIDI input: every note on (velocity above zero) is a tap, stamped when
/// its bytes were read. The channel closes when the device ends or fails.
pub fn device_taps(mut device: Box<dyn Device>) -> io::Result<(Taps, TapThread)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    let handle = std::thread::Builder::new().name("midi-taps".into()).spawn(move || {
        let mut parser = Parser::new();
        let mut buf = vec![0u8; crate::device::cable::MAX_DATAGRAM];
        while !stopped.load(Ordering::Relaxed) {
            match device.read(&mut buf, Some(Duration::from_millis(100))) {
                Ok(0) => return,
                Ok(n) => {
                    let t = ictus_rt::clock::now();
                    for &b in &buf[..n] {
                        for m in parser.feed(b, t) {
                            if m.kind() == Kind::NoteOn && m.bytes()[2] > 0 && tx.send(m.time()).is_err() {
                                return;
                            }
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(_) => return,
            }
        }
    })?;
    Ok((rx, TapThread { stop, handle: Some(handle), restore: None }))
}

/// Why the terminal cannot give taps.
#[derive(Debug, thiserror::Error)]
pub enum TerminalError {
    /// Standard input is not a terminal.
    #[error("standard input is not a terminal: conducting needs one for taps (or use --tap-device)")]
    NotATerminal,
    /// A terminal call failed.
    #[error("setting up the terminal: {0}")]
    Io(#[from] io::Error),
}

/// Taps from the terminal on standard input, put in raw mode (no line buffering, no
/// echo, no signals) until the [`TapThread`] is dropped: any key is a tap; `q`, Escape,
/// Ctrl-C or Ctrl-D stops (closes the channel).
pub fn terminal_taps() -> Result<(Taps, TapThread), TerminalError> {
    terminal_taps_on(std::io::stdin().as_fd().try_clone_to_owned()?)
}

/// [`terminal_taps`] on the terminal `fd` instead of standard input.
pub fn terminal_taps_on(fd: OwnedFd) -> Result<(Taps, TapThread), TerminalError> {
    use rustix::termios::{tcgetattr, tcsetattr, LocalModes, OptionalActions};
    let saved = match tcgetattr(&fd) {
        Ok(t) => t,
        Err(rustix::io::Errno::NOTTY) => return Err(TerminalError::NotATerminal),
        Err(e) => return Err(TerminalError::Io(e.into())),
    };
    let mut raw = saved.clone();
    raw.local_modes &= !(LocalModes::ICANON | LocalModes::ECHO | LocalModes::ISIG);
    tcsetattr(&fd, OptionalActions::Now, &raw).map_err(io::Error::from)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    let reader = fd.try_clone()?;
    let handle = std::thread::Builder::new().name("midi-keys".into()).spawn(move || {
        let mut buf = [0u8; 64];
        while !stopped.load(Ordering::Relaxed) {
            match crate::device::wait_fd(reader.as_fd(), rustix::event::PollFlags::IN, Some(Duration::from_millis(100)))
            {
                Ok(false) => continue,
                Ok(true) => {}
                Err(_) => return,
            }
            let n = match rustix::io::read(&reader, &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let t = ictus_rt::clock::now();
            for &b in &buf[..n] {
                if matches!(b, b'q' | b'Q' | 0x1B | 0x03 | 0x04) || tx.send(t).is_err() {
                    return;
                }
            }
        }
    });
    let handle = match handle {
        Ok(h) => h,
        Err(e) => {
            let _ = tcsetattr(&fd, OptionalActions::Now, &saved);
            return Err(e.into());
        }
    };
    Ok((rx, TapThread { stop, handle: Some(handle), restore: Some((fd, saved)) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::serial::Pty;
    use rustix::termios::LocalModes;

    #[test]
    fn terminal_taps_in_raw_mode_and_the_terminal_restored() {
        let mut pty = Pty::open().unwrap();
        let slave = rustix::fs::open(
            pty.slave_path(),
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let check = slave.try_clone().unwrap();
        // A cooked terminal, as a shell leaves it (`Pty::open` made the pair raw).
        let mut cooked = rustix::termios::tcgetattr(&check).unwrap();
        cooked.local_modes |= LocalModes::ICANON | LocalModes::ECHO | LocalModes::ISIG;
        rustix::termios::tcsetattr(&check, rustix::termios::OptionalActions::Now, &cooked).unwrap();
        let (taps, thread) = terminal_taps_on(slave).unwrap();
        let raw = rustix::termios::tcgetattr(&check).unwrap().local_modes;
        assert!(!raw.intersects(LocalModes::ICANON | LocalModes::ECHO | LocalModes::ISIG), "{raw:?}");
        // Two keys, no newline (raw mode delivers them at once), then q.
        let before = ictus_rt::clock::now();
        pty.write(b" x").unwrap();
        let watchdog = Duration::from_secs(30);
        assert!(taps.recv_timeout(watchdog).unwrap() >= before);
        assert!(taps.recv_timeout(watchdog).is_ok());
        pty.write(b"q").unwrap();
        assert_eq!(taps.recv_timeout(watchdog), Err(RecvTimeoutError::Disconnected));
        drop(thread);
        assert!(rustix::termios::tcgetattr(&check)
            .unwrap()
            .local_modes
            .contains(LocalModes::ICANON | LocalModes::ECHO));
    }

    #[test]
    fn a_non_terminal_gives_no_taps() {
        let (r, _w) = rustix::pipe::pipe().unwrap();
        assert!(matches!(terminal_taps_on(r), Err(TerminalError::NotATerminal)));
    }
}
