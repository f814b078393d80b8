//! Real-time ports in a task's name space: allocation, association, connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ictus_ipc::{Name, Space};

use crate::attr::{PortAttrs, Priority};
use crate::client::RtClient;
use crate::error::{AllocateError, AssociateError, MemberError, SendError};
use crate::group::{Group, Receiver};
use crate::port::{PortInner, PortStats};

/// How long [`RtSpace::connect`] waits for a port to answer.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The real-time ports a task receives from, by name, each with its own receivers.
type PortTable = Arc<Mutex<Vec<(Name, Arc<PortInner>, Arc<Group>)>>>;

/// The real-time port sets of a task, by name: groups of receivers over member ports.
type SetTable = Arc<Mutex<Vec<(Name, Arc<Group>)>>>;

/// A task's real-time ports, beside its plain ones in the same [`Space`].
///
/// A real-time port is named in the space by its send right, so it can be given to
/// other tasks in ordinary messages; this task, which holds its receive side, can also
/// associate receivers with it. A name that denotes a plain port is refused with the
/// paper's errors: [`AssociateError::InvalidName`], [`SendError::InvalidDest`].
///
/// A **real-time port set** ([`RtSpace::allocate_set`]) gathers real-time ports
/// ([`RtSpace::move_member`]); threads [associate](RtSpace::associate_set) with the set
/// and receive from all its members, the most urgent message first. A port is in at most
/// one set and, while it is, is received from only through the set.
#[derive(Debug, Clone)]
pub struct RtSpace {
    space: Space,
    ports: PortTable,
    sets: SetTable,
}

impl RtSpace {
    /// Real-time ports in `space`.
    pub fn new(space: Space) -> RtSpace {
        RtSpace { space, ports: Arc::new(Mutex::new(Vec::new())), sets: Arc::new(Mutex::new(Vec::new())) }
    }

    /// The plain name space.
    pub fn space(&self) -> &Space {
        &self.space
    }

    fn find(&self, name: Name) -> Option<(Arc<PortInner>, Arc<Group>)> {
        let ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        ports.iter().find(|(n, _, _)| *n == name).map(|(_, p, g)| (Arc::clone(p), Arc::clone(g)))
    }

    fn find_set(&self, name: Name) -> Option<Arc<Group>> {
        let sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        sets.iter().find(|(n, _)| *n == name).map(|(_, s)| Arc::clone(s))
    }

    /// Allocates an empty real-time port set (`rt_mach_port_allocate` of a port set).
    /// Its name denotes a port set in the plain space too (which stays empty: plain
    /// ports cannot join a real-time set).
    pub fn allocate_set(&self) -> Result<Name, AllocateError> {
        let set = Group::for_set()?;
        let name = self.space.allocate_port_set()?;
        self.sets.lock().unwrap_or_else(|p| p.into_inner()).push((name, set));
        Ok(name)
    }

    /// Moves the real-time port `member` into the real-time port set `set`, out of the
    /// set it was in; `Name::NULL` takes it out of any set (`mach_port_move_member`).
    /// A plain port or a plain port set is [`MemberError::InvalidRight`], a name that
    /// denotes nothing [`MemberError::InvalidName`]; a port with receivers of its own
    /// associated is refused ([`MemberError::Associated`]). Messages waiting on the
    /// port go with it.
    pub fn move_member(&self, member: Name, set: Name) -> Result<(), MemberError> {
        let bad = |name: Name| match self.space.right_kinds(name) {
            Ok(_) => MemberError::InvalidRight(name),
            Err(_) => MemberError::InvalidName(name),
        };
        let (port, own) = self.find(member).ok_or_else(|| bad(member))?;
        let target = if set == Name::NULL { None } else { Some(self.find_set(set).ok_or_else(|| bad(set))?) };
        // One membership change at a time in this space.
        let sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        let current = sets.iter().map(|(_, s)| s).find(|s| s.contains(&port)).cloned();
        if let Some(c) = current {
            if target.as_ref().is_some_and(|t| Arc::ptr_eq(&c, t)) {
                return Ok(());
            }
            c.remove(&port);
        }
        match target {
            Some(t) => t.add(member, &port, &own),
            None => Ok(()),
        }
    }

    /// The real-time ports in the real-time port set `set`.
    pub fn set_members(&self, set: Name) -> Result<Vec<Name>, MemberError> {
        match self.find_set(set) {
            Some(s) => Ok(s.member_names()),
            None => Err(match self.space.right_kinds(set) {
                Ok(_) => MemberError::InvalidRight(set),
                Err(_) => MemberError::InvalidName(set),
            }),
        }
    }

    /// How many receivers are associated with the real-time port set `set`.
    pub fn set_receivers(&self, set: Name) -> Option<usize> {
        self.find_set(set).map(|s| s.receiver_count())
    }

    /// Associates the calling thread with the real-time port set `set` as a receiver
    /// (`rt_mach_port_associate` on a port set): it receives from every member. A plain
    /// port set (or anything but a real-time port set) is [`AssociateError::InvalidName`],
    /// as in the paper. A thread is associated with one port or port set at a time.
    pub fn associate_set(&self, set: Name, priority: Option<Priority>) -> Result<Receiver, AssociateError> {
        self.find_set(set).ok_or(AssociateError::InvalidName(set))?.associate(priority, |_| Ok(()))
    }

    /// Allocates a real-time port with these attributes and its message buffers
    /// (`rt_mach_port_allocate`). The name denotes a send right in the space.
    pub fn allocate(&self, attrs: PortAttrs) -> Result<Name, AllocateError> {
        let port = PortInner::allocate(&self.space, attrs)?;
        let name = self.space.insert_send_fd(port.send_right()?)?;
        let group = Group::for_port(name, Arc::clone(&port));
        self.ports.lock().unwrap_or_else(|p| p.into_inner()).push((name, port, group));
        Ok(name)
    }

    /// Associates the calling thread with the real-time port `name` as a receiver
    /// (`rt_mach_port_associate`). `priority` is the receiver's priority for
    /// dispatch by priority (`priop`): the thread is set to it (if permitted). A port in
    /// a real-time port set is [`AssociateError::InSet`] (associate with the set); a
    /// real-time port set is [`RtSpace::associate_set`]'s.
    pub fn associate(&self, name: Name, priority: Option<Priority>) -> Result<Receiver, AssociateError> {
        let (port, group) = self.find(name).ok_or(AssociateError::InvalidName(name))?;
        group.associate(priority, |_| if port.lock().in_set { Err(AssociateError::InSet) } else { Ok(()) })
    }

    /// Connects the calling thread to the real-time port `name` (a send right, here or
    /// received from another task).
    pub fn connect(&self, name: Name) -> Result<RtClient, SendError> {
        self.connect_timeout(name, DEFAULT_CONNECT_TIMEOUT)
    }

    /// As [`RtSpace::connect`], waiting at most `timeout` for the port to answer.
    pub fn connect_timeout(&self, name: Name, timeout: Duration) -> Result<RtClient, SendError> {
        let fd = self.space.send_right_fd(name).map_err(|_| SendError::InvalidDest(name, "not a send right"))?;
        let local = self.find(name).map(|(p, _)| p);
        RtClient::connect(fd, name, local.as_ref(), timeout)
    }

    /// The port's counters, if it is a real-time port held here.
    pub fn stats(&self, name: Name) -> Option<PortStats> {
        self.find(name).map(|(p, g)| p.stats(g.receiver_count()))
    }

    /// Destroys a real-time port held here: its receivers get `PortDied`, its clients a
    /// hang-up; it leaves its set; the name is deallocated. For a real-time port set:
    /// its receivers get `PortDied` and its members leave it (they live on).
    pub fn destroy(&self, name: Name) -> Result<(), AssociateError> {
        let set = {
            let mut sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
            match sets.iter().position(|(n, _)| *n == name) {
                Some(i) => Some(sets.swap_remove(i).1),
                None => {
                    if let Some((port, _)) = self.find(name) {
                        for (_, s) in sets.iter() {
                            s.remove(&port);
                        }
                    }
                    None
                }
            }
        };
        if let Some(set) = set {
            set.destroy_set();
            let _ = self.space.destroy(name);
            return Ok(());
        }
        let (_, port, group) = {
            let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
            let i = ports.iter().position(|(n, _, _)| *n == name).ok_or(AssociateError::InvalidName(name))?;
            ports.swap_remove(i)
        };
        group.destroy();
        port.destroy();
        let _ = self.space.destroy(name);
        Ok(())
    }
}
