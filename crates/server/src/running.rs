//! A server on a thread of this process, and a server in the foreground until a signal.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;

use crate::ServeError;

/// A server running on a thread of this process (for tests, benchmarks, and programs
/// that embed one): its thread and the write end of its stop channel. Dropping it stops
/// the server and waits for its thread.
///
/// Each server wraps it with what its callers need (its ports, its counters).
#[derive(Debug)]
#[must_use = "dropping a Running stops the server"]
pub struct Running {
    thread: Option<JoinHandle<Result<(), ServeError>>>,
    stop: Option<UnixStream>,
}

impl Running {
    /// Start `serve` on a new thread called `name`, with the read end of a stop channel
    /// that becomes readable when [`Running::stop`] is called or the `Running` dropped.
    /// `serve` returns when it sees that, after releasing what it holds.
    pub fn spawn(
        name: &str,
        serve: impl FnOnce(BorrowedFd<'_>) -> Result<(), ServeError> + Send + 'static,
    ) -> Result<Running, ServeError> {
        let (stop_r, stop_w) = UnixStream::pair().map_err(ServeError::Signals)?;
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || serve(stop_r.as_fd()))
            .map_err(ServeError::Thread)?;
        Ok(Running { thread: Some(thread), stop: Some(stop_w) })
    }

    /// Stop the server, wait for its thread, and report how it ended.
    pub fn stop(mut self) -> Result<(), ServeError> {
        self.stop_inner()
    }

    /// Whether the server's thread has ended (by itself: an error, or a panic).
    pub fn is_finished(&self) -> bool {
        !matches!(&self.thread, Some(t) if !t.is_finished())
    }

    fn stop_inner(&mut self) -> Result<(), ServeError> {
        // Closing our end makes the server's end readable (end of file).
        drop(self.stop.take());
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| ServeError::Panicked)?,
            None => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// Run `serve` in the foreground with a stop channel that becomes readable on `SIGTERM`
/// or `SIGINT` (a signal that arrives while the server starts is then a clean stop, not
/// a socket left behind), and restore the signals' handling afterwards.
pub fn serve_until_signalled<T, E: From<ServeError>>(
    serve: impl FnOnce(BorrowedFd<'_>) -> Result<T, E>,
) -> Result<T, E> {
    let (stop_r, stop_w) = UnixStream::pair().map_err(ServeError::Signals)?;
    let mut ids = Vec::new();
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let registered = stop_w
            .try_clone()
            .and_then(|w| signal_hook::low_level::pipe::register(sig, w))
            .map_err(ServeError::Signals);
        match registered {
            Ok(id) => ids.push(id),
            Err(e) => {
                for id in ids {
                    signal_hook::low_level::unregister(id);
                }
                return Err(e.into());
            }
        }
    }
    let result = serve(stop_r.as_fd());
    for id in ids {
        signal_hook::low_level::unregister(id);
    }
    result
}
