//! Real-time ports in a task's name space: allocation, association, connection.

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ictus_ipc::{Name, Space};

use crate::attr::{PortAttrs, Priority};
use crate::client::RtClient;
use crate::error::{AllocateError, AssociateError, SendError};
use crate::port::{PortInner, PortStats, Receiver};

/// How long [`RtSpace::connect`] waits for a port to answer.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The real-time ports a task receives from, by name.
type PortTable = Arc<Mutex<Vec<(Name, Arc<PortInner>)>>>;

/// A task's real-time ports, beside its plain ones in the same [`Space`].
///
/// A real-time port is named in the space by its send right, so it can be given to
/// other tasks in ordinary messages; this task, which holds its receive side, can also
/// associate receivers with it. A name that denotes a plain port is refused with the
/// paper's errors: [`AssociateError::InvalidName`], [`SendError::InvalidDest`].
#[derive(Debug, Clone)]
pub struct RtSpace {
    space: Space,
    ports: PortTable,
}

impl RtSpace {
    /// Real-time ports in `space`.
    pub fn new(space: Space) -> RtSpace {
        RtSpace { space, ports: Arc::new(Mutex::new(Vec::new())) }
    }

    /// The plain name space.
    pub fn space(&self) -> &Space {
        &self.space
    }

    fn find(&self, name: Name) -> Option<Arc<PortInner>> {
        let ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        ports.iter().find(|(n, _)| *n == name).map(|(_, p)| Arc::clone(p))
    }

    /// Allocates a real-time port with these attributes and its message buffers
    /// (`rt_mach_port_allocate`). The name denotes a send right in the space.
    pub fn allocate(&self, attrs: PortAttrs) -> Result<Name, AllocateError> {
        let port = PortInner::allocate(attrs)?;
        let name = self.space.insert_send_fd(port.send_right()?)?;
        self.ports.lock().unwrap_or_else(|p| p.into_inner()).push((name, port));
        Ok(name)
    }

    /// Associates the calling thread with the real-time port `name` as a receiver
    /// (`rt_mach_port_associate`). `priority` is the receiver's priority for
    /// dispatch by priority (`priop`): the thread is set to it (if permitted).
    pub fn associate(&self, name: Name, priority: Option<Priority>) -> Result<Receiver, AssociateError> {
        self.find(name).ok_or(AssociateError::InvalidName(name))?.associate(priority)
    }

    /// Connects the calling thread to the real-time port `name` (a send right, here or
    /// received from another task).
    pub fn connect(&self, name: Name) -> Result<RtClient, SendError> {
        self.connect_timeout(name, DEFAULT_CONNECT_TIMEOUT)
    }

    /// As [`RtSpace::connect`], waiting at most `timeout` for the port to answer.
    pub fn connect_timeout(&self, name: Name, timeout: Duration) -> Result<RtClient, SendError> {
        let fd = self.space.send_right_fd(name).map_err(|_| SendError::InvalidDest(name, "not a send right"))?;
        let local = self.find(name);
        RtClient::connect(fd.as_fd(), name, local.as_deref(), timeout)
    }

    /// The port's counters, if it is a real-time port held here.
    pub fn stats(&self, name: Name) -> Option<PortStats> {
        self.find(name).map(|p| p.stats())
    }

    /// Destroys a real-time port held here: its receivers get `PortDied`, its clients a
    /// hang-up; the name is deallocated.
    pub fn destroy(&self, name: Name) -> Result<(), AssociateError> {
        let port = {
            let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
            let i = ports.iter().position(|(n, _)| *n == name).ok_or(AssociateError::InvalidName(name))?;
            ports.swap_remove(i).1
        };
        port.destroy();
        let _ = self.space.destroy(name);
        Ok(())
    }
}
