//! What every long-running server needs besides its interface: its ports in one port
//! set, and dead-name requests on the rights it keeps for its clients.
//!
//! The name server, the clock server and the MIDI input server all receive on a port set
//! holding their service port(s) and a notification port, and all keep clients' send
//! rights (alarm ports, subscribers, registered rights) that must be dropped when the
//! port behind them dies. These two small types are that shared part.

use std::collections::HashMap;

use ictus_abi::Name;
use ictus_ipc::{Disposition, NotifyKind, PortArg, RightKind, RightsError, Space};

/// A server's receive rights: `N` service ports and one notification port, all
/// members of one port set, so one `receive` on [`ServicePorts::set`] serves them all.
/// Dropping it destroys them (what was made so far, if [`ServicePorts::allocate`] fails).
#[derive(Debug)]
pub struct ServicePorts<const N: usize> {
    space: Space,
    set: Name,
    services: [Name; N],
    notify: Name,
}

impl<const N: usize> ServicePorts<N> {
    /// Allocate the set, `N` service ports and the notification port, and put the
    /// ports in the set.
    pub fn allocate(space: &Space) -> Result<ServicePorts<N>, RightsError> {
        // Dropping `p` on an error releases whatever was made.
        let mut p =
            ServicePorts { space: space.clone(), set: Name::NULL, services: [Name::NULL; N], notify: Name::NULL };
        p.set = space.allocate_port_set()?;
        for i in 0..N {
            p.services[i] = space.allocate_port()?;
            space.move_member(p.services[i], p.set)?;
        }
        p.notify = space.allocate_port()?;
        space.move_member(p.notify, p.set)?;
        Ok(p)
    }

    /// Refuse messages with more than `bytes` of in-line data on every port, unread
    /// (`Space::set_message_limit`; a sender through a send right is refused before it
    /// sends). Each server sets what its own protocol takes, so that no client can make
    /// it hold memory for a message it never wanted ([`SMALL_REQUESTS`]).
    pub fn set_message_limit(&self, bytes: u32) -> Result<(), RightsError> {
        for &port in self.services.iter().chain([&self.notify]) {
            self.space.set_message_limit(port, bytes)?;
        }
        Ok(())
    }

    /// The port set to receive on.
    pub fn set(&self) -> Name {
        self.set
    }

    /// Service port `i` (in the order the server gave them meaning).
    pub fn service(&self, i: usize) -> Name {
        self.services[i]
    }

    /// The port the server asks its notifications to be sent to.
    pub fn notify(&self) -> Name {
        self.notify
    }
}

/// The message limit of a server whose requests and notifications are small: a name of
/// at most 255 bytes, a time, a filter. 4 KiB, with room to spare.
pub const SMALL_REQUESTS: u32 = 4 << 10;

/// Receive errors in a row after which a server's loop gives up (a broken set, not a
/// bad client: malformed messages do not count).
pub const MAX_CONSECUTIVE_ERRORS: u32 = 1000;

/// What a server's receive loop has counted ([`crate::Loop::handle_pending`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveCounts {
    /// Malformed messages dropped since the start.
    pub malformed: u64,
    /// Receive errors since the last message received.
    pub consecutive_errors: u32,
}

impl<const N: usize> Drop for ServicePorts<N> {
    fn drop(&mut self) {
        for port in self.services.into_iter().chain([self.notify]) {
            if port != Name::NULL {
                // Out of the set first: destroying a receive right that is a set member
                // deadlocks in the nucleus (`destroy_receive` holds the port's lock
                // while removing it from its set).
                let _ = self.space.move_member(port, Name::NULL);
                let _ = self.space.mod_refs(port, RightKind::Receive, -1);
            }
        }
        if self.set != Name::NULL {
            let _ = self.space.mod_refs(self.set, RightKind::PortSet, -1);
        }
    }
}

/// Counted dead-name requests: a server that keeps the same client right for several
/// purposes (three alarms to one port) arms one request and cancels it with the last use.
#[derive(Debug, Default)]
pub struct DeadNameWatches {
    watched: HashMap<Name, usize>,
}

impl DeadNameWatches {
    /// An empty set of watches.
    pub fn new() -> DeadNameWatches {
        DeadNameWatches::default()
    }

    /// Count one more use of `right`, arming its dead-name request (to `notify`, as a
    /// made send right) with the first. Fails if the right is already dead or not a
    /// right the space can watch.
    pub fn watch(&mut self, space: &Space, right: Name, notify: Name) -> Result<(), RightsError> {
        let n = self.watched.get(&right).copied().unwrap_or(0);
        if n == 0 {
            space.request_notification(
                right,
                NotifyKind::DeadName,
                Some(PortArg::new(notify, Disposition::MakeSend)),
            )?;
        }
        self.watched.insert(right, n + 1);
        Ok(())
    }

    /// Count one use of `right` less, cancelling its request with the last. Call it
    /// before the right is released or used up: a name that goes away with a request
    /// still armed could be reused and watched by mistake.
    pub fn unwatch(&mut self, space: &Space, right: Name) {
        match self.watched.get(&right).copied() {
            Some(n) if n > 1 => {
                self.watched.insert(right, n - 1);
            }
            Some(_) => {
                self.watched.remove(&right);
                let _ = space.request_notification(right, NotifyKind::DeadName, None);
            }
            None => {}
        }
    }

    /// Forget `right` whatever its count (its port died, or the server drops every use
    /// at once), cancelling its request; whether it was watched.
    pub fn forget(&mut self, space: &Space, right: Name) -> bool {
        let was = self.watched.remove(&right).is_some();
        if was {
            let _ = space.request_notification(right, NotifyKind::DeadName, None);
        }
        was
    }

    /// Forget every right, cancelling their requests (the server is stopping).
    pub fn forget_all(&mut self, space: &Space) {
        for (right, _) in self.watched.drain() {
            let _ = space.request_notification(right, NotifyKind::DeadName, None);
        }
    }

    /// How many rights are watched.
    pub fn len(&self) -> usize {
        self.watched.len()
    }

    /// Whether no right is watched.
    pub fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ictus_ipc::{ReceiveOptions, Received};
    use std::time::Duration;

    #[test]
    fn ports_are_in_the_set_and_go_with_the_value() {
        let space = Space::new();
        let before = space.names().len();
        {
            let p = ServicePorts::<2>::allocate(&space).expect("ports");
            let members = space.set_members(p.set()).expect("members");
            for port in [p.service(0), p.service(1), p.notify()] {
                assert!(members.contains(&port), "{port:?} is not in the set");
            }
        }
        assert_eq!(space.names().len(), before, "dropping the ports leaves nothing behind");
    }

    #[test]
    fn one_request_per_right_cancelled_with_the_last_use() {
        let server = Space::new();
        let ports = ServicePorts::<1>::allocate(&server).expect("ports");
        let client = Space::new();
        let client_port = client.allocate_port().expect("port");
        let (right, _) = server.extract_right(&client, client_port, Disposition::MakeSend).expect("right");
        let mut w = DeadNameWatches::new();
        w.watch(&server, right, ports.notify()).expect("watch");
        w.watch(&server, right, ports.notify()).expect("watch again");
        assert_eq!(w.len(), 1);
        w.unwatch(&server, right);
        assert_eq!(w.len(), 1, "one use left");
        // Still armed: the client's port dying sends the notification.
        client.mod_refs(client_port, RightKind::Receive, -1).expect("destroy");
        let mut rcv = Received::new();
        let opts = ReceiveOptions { timeout: Some(Duration::from_secs(30)), ..ReceiveOptions::default() };
        server.receive(ports.set(), &mut rcv, opts).expect("the dead-name notification");
        assert_eq!(rcv.port, ports.notify());
        assert!(w.forget(&server, right));
        assert!(w.is_empty());
        assert!(!w.forget(&server, right), "forgotten once");
    }
}
