//! The receive loop every server runs: one `poll` on the stop channel, the port set, the
//! well-known socket if the server has one, and the server's own descriptors.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use ictus_abi::{Name, NotifyId};
use ictus_idl::Dispatched;
use ictus_ipc::{ReceiveError, ReceiveOptions, Received, Space};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;

use crate::listener::Listener;
use crate::ports::{ReceiveCounts, ServicePorts, MAX_CONSECUTIVE_ERRORS};
use crate::ServeError;

/// Messages handled per wake-up before the loop looks at its other descriptors again.
pub const BATCH: usize = 64;

/// What a server does with what arrives: the part of a server that is its own. The
/// [`Loop`] around it receives, tells notifications from requests, counts malformed
/// messages and stops when told.
pub trait Serve {
    /// The server's name in log lines: `ictus NAME: …` (`"clock-server"`).
    const NAME: &'static str;

    /// Handle one request: a message that arrived on one of the service ports
    /// (`msg.port` says which). Whatever it carried and nobody keeps must be released;
    /// [`ictus_idl::Server::handle`] does that, and answers or refuses the request.
    fn request(&mut self, msg: &mut Received) -> Dispatched;

    /// A right the server watches died: its dead-name notification arrived on the
    /// notify port, from this process's own notifier (the loop has checked the
    /// kernel-verified sender). Drop whatever holds it; the loop releases the message.
    fn dead_name(&mut self, _name: Name) {}

    /// Called before each wait: do the server's own work (alarms that are due, a ring
    /// to drain) and say how long the wait may last.
    fn prepare(&mut self) -> Result<Wait, ServeError> {
        Ok(Wait::Until(None))
    }

    /// The server's own descriptors (a timer, a ring's bell) to wait on with its ports,
    /// in an order [`Serve::ready`] knows.
    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        Vec::new()
    }

    /// Descriptor `index` of [`Serve::fds`] is readable (called before the ports are
    /// handled, in index order).
    fn ready(&mut self, _index: usize) -> Result<(), ServeError> {
        Ok(())
    }

    /// A malformed or oversized message was dropped (the nucleus refused it); `count`
    /// so far. The default says so at powers of two, so that a hostile sender cannot
    /// flood the log.
    fn malformed(&mut self, count: u64, e: &ReceiveError) {
        if count.is_power_of_two() {
            let (sender, what) = match e {
                ReceiveError::Malformed { sender, .. } => (sender.map_or(0, |s| s.pid), "a malformed"),
                // Refused by its header alone (the port's message limit), unread.
                ReceiveError::TooLarge { sender, .. } => (sender.map_or(0, |s| s.pid), "an oversized"),
                _ => (0, "a bad"),
            };
            tracing::warn!(
                server = Self::NAME,
                count,
                client_pid = sender,
                "dropped {what} message ({count} refused so far): {e}"
            );
        }
    }
}

/// How long the loop may wait, as [`Serve::prepare`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Until something is readable, or until this time if there is one.
    Until(Option<Instant>),
    /// Not at all: there is more work; look at the descriptors and come back.
    Again,
}

/// A well-known socket the loop serves: each allowed peer gets a send right to service
/// port `port`.
#[derive(Clone, Copy, Debug)]
pub struct Door<'a> {
    /// The listening socket.
    pub listener: &'a Listener,
    /// Which service port it hands out.
    pub port: usize,
}

/// A server: its ports and the receive loop around what it does ([`Serve`]).
///
/// `N` service ports and a notify port, in one port set; the loop waits in one `poll`
/// on the stop channel, the set, the server's [`Door`] if it has one, and the server's
/// own descriptors. A message on the notify port is a dead-name notification only if
/// its kernel-verified sender is this very process; it goes to [`Serve::dead_name`].
/// Any other message is a request, for [`Serve::request`].
///
/// Dropping the loop drops the server first (which releases the rights it keeps), then
/// destroys the ports: clients' calls fail with `ServerDied` at once.
#[derive(Debug)]
pub struct Loop<S: Serve, const N: usize> {
    space: Space,
    pid: u32,
    counts: ReceiveCounts,
    server: S,
    // Last: dropped after the server has released the rights it keeps.
    ports: ServicePorts<N>,
}

impl<S: Serve, const N: usize> Loop<S, N> {
    /// A loop serving `server` on `ports`, in `space`.
    pub fn new(space: &Space, ports: ServicePorts<N>, server: S) -> Loop<S, N> {
        Loop { space: space.clone(), pid: std::process::id(), counts: ReceiveCounts::default(), server, ports }
    }

    /// The space the server's rights live in.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// The ports.
    pub fn ports(&self) -> &ServicePorts<N> {
        &self.ports
    }

    /// The server.
    pub fn server(&self) -> &S {
        &self.server
    }

    /// The server, to change.
    pub fn server_mut(&mut self) -> &mut S {
        &mut self.server
    }

    /// Malformed messages received (and destroyed by the nucleus) so far.
    pub fn malformed(&self) -> u64 {
        self.counts.malformed
    }

    /// Serve until `stop` becomes readable (a byte written, or its peer closed).
    pub fn run(&mut self, door: Option<Door<'_>>, stop: BorrowedFd<'_>) -> Result<(), ServeError> {
        let ports = self.space.pollable_fd(self.ports.set())?;
        let mut rcv = Received::new();
        loop {
            let timeout = match self.server.prepare()? {
                Wait::Again => Some(Duration::ZERO),
                Wait::Until(None) => None,
                Wait::Until(Some(t)) => Some(t.saturating_duration_since(Instant::now())),
            };
            let timeout = timeout.map(|d| rustix::time::Timespec {
                tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
                tv_nsec: i64::from(d.subsec_nanos()),
            });
            // Which of the server's own descriptors (the first 64) are readable, as bits.
            let (stop_ready, ports_ready, door_ready, own_ready) = {
                let own = self.server.fds();
                let mut fds = Vec::with_capacity(3 + own.len());
                fds.push(PollFd::from_borrowed_fd(stop, PollFlags::IN));
                fds.push(PollFd::new(&ports, PollFlags::IN));
                if let Some(d) = &door {
                    fds.push(PollFd::from_borrowed_fd(d.listener.as_fd(), PollFlags::IN));
                }
                let first_own = fds.len();
                fds.extend(own.into_iter().map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN)));
                match poll(&mut fds, timeout.as_ref()) {
                    Ok(_) => {}
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(ServeError::Poll(e)),
                }
                let ready = |i: usize| fds.get(i).is_some_and(|f| !f.revents().is_empty());
                let own_ready = (first_own..fds.len().min(first_own + 64))
                    .filter(|&i| ready(i))
                    .fold(0u64, |bits, i| bits | 1 << (i - first_own));
                (ready(0), ready(1), door.is_some() && ready(2), own_ready)
            };
            if stop_ready {
                return Ok(());
            }
            for i in (0..64).filter(|i| own_ready & 1 << i != 0) {
                self.server.ready(i)?;
            }
            if ports_ready {
                self.handle_pending(&mut rcv, BATCH)?;
            }
            if let (true, Some(d)) = (door_ready, &door) {
                let port = self.ports.service(d.port);
                let (_, refused) = d.listener.serve_pending(|| self.space.send_right_fd(port).ok());
                if refused > 0 {
                    tracing::warn!(
                        server = S::NAME,
                        refused,
                        path = %d.listener.path().display(),
                        "refused {refused} connection(s) to {} from another user",
                        d.listener.path().display()
                    );
                }
            }
        }
    }

    /// Receive and handle up to `max` messages already waiting; returns how many were
    /// handled. A malformed message is dropped and counted ([`Serve::malformed`]); any
    /// other receive error ends the batch, and [`MAX_CONSECUTIVE_ERRORS`] of them in a
    /// row are returned.
    pub fn handle_pending(&mut self, rcv: &mut Received, max: usize) -> Result<usize, ServeError> {
        let now = ReceiveOptions { timeout: Some(Duration::ZERO), ..ReceiveOptions::default() };
        let mut handled = 0;
        while handled < max {
            match self.space.receive(self.ports.set(), rcv, now) {
                Ok(()) => {
                    self.counts.consecutive_errors = 0;
                    self.handle(rcv);
                    handled += 1;
                }
                Err(ReceiveError::TimedOut) => break,
                // A bad client's message, refused and counted: not an error of the set.
                Err(e @ (ReceiveError::Malformed { .. } | ReceiveError::TooLarge { .. })) => {
                    self.counts.malformed += 1;
                    self.server.malformed(self.counts.malformed, &e);
                }
                Err(e) => {
                    self.counts.consecutive_errors += 1;
                    if self.counts.consecutive_errors >= MAX_CONSECUTIVE_ERRORS {
                        return Err(ServeError::Receive(e));
                    }
                    break;
                }
            }
        }
        Ok(handled)
    }

    /// Handle one received message: a notification on the notify port, or a request.
    pub fn handle(&mut self, msg: &mut Received) -> Dispatched {
        if msg.port == self.ports.notify() {
            // Only this process's notifier sends here; the kernel stamps the pid.
            if msg.sender.pid == self.pid && msg.id == NotifyId::DeadName.id() {
                if let Some((name, _)) = NotifyId::parse_body(msg.data()) {
                    self.server.dead_name(name);
                }
            }
            ictus_idl::release_rights(&self.space, msg);
            return Dispatched::OneWay;
        }
        self.server.request(msg)
    }
}
