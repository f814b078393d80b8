//! Rights that cross the edge of ictus's messages: the bootstrap right a parent gives a
//! child (inherited as descriptor 3, named by `ICTUS_BOOTSTRAP_FD`), and send rights
//! passed as raw descriptors (the name server's well-known socket).

use std::os::fd::{AsFd, OwnedFd};

use ictus_abi::Name;
use rustix::io::Errno;

use crate::error::RightsError;
use crate::space::Space;
use crate::sys;
use crate::table::{Entry, PortEntry};

impl Space {
    /// Give a child process, about to be spawned by `cmd`, a send right to the port
    /// named `name` as its bootstrap port (made from a receive right, or copied from a
    /// send right). The child finds it with [`Space::take_bootstrap`].
    pub fn give_bootstrap(&self, cmd: &mut std::process::Command, name: Name) -> Result<(), RightsError> {
        let fd = self.send_right_fd(name)?;
        cmd.env(crate::BOOTSTRAP_ENV, crate::BOOTSTRAP_FD.to_string());
        sys::inherit_as(cmd, fd, crate::BOOTSTRAP_FD);
        Ok(())
    }

    /// In a child spawned with [`Space::give_bootstrap`]: take the inherited send
    /// right into this space. `None` if this process was not given one. Call it early,
    /// before other threads read the environment.
    pub fn take_bootstrap(&self) -> Result<Option<Name>, RightsError> {
        let Ok(v) = std::env::var(crate::BOOTSTRAP_ENV) else { return Ok(None) };
        std::env::remove_var(crate::BOOTSTRAP_ENV);
        let raw: i32 = v.parse().map_err(|_| RightsError::InvalidValue)?;
        let fd = sys::take_inherited(raw).map_err(|e| match e {
            Errno::INVAL => RightsError::InvalidValue,
            e => RightsError::Os(e),
        })?;
        let ident = sys::identity(fd.as_fd())?;
        Ok(Some(self.table().insert_send(fd, ident)?))
    }

    /// Insert a send right from a raw socket descriptor received outside ictus
    /// (for example from the name server's well-known socket). The descriptor is
    /// checked to be a port socket.
    pub fn insert_send_fd(&self, fd: OwnedFd) -> Result<Name, RightsError> {
        if !sys::is_port_socket(fd.as_fd()) {
            return Err(RightsError::InvalidValue);
        }
        let ident = sys::identity(fd.as_fd())?;
        self.table().insert_send(fd, ident)
    }

    /// A duplicate of the descriptor behind a send right (or a new send right made
    /// from a receive right), to hand to a process outside ictus's messages.
    pub fn send_right_fd(&self, name: Name) -> Result<OwnedFd, RightsError> {
        let mut t = self.table();
        match t.get_mut(name)? {
            Entry::Port(PortEntry { send: Some(s), .. }) => Ok(sys::dup(s.fd.as_fd())?),
            Entry::Port(PortEntry { recv: Some(p), .. }) => {
                let mut st = p.lock();
                let (fd, _, _) = st.send_end()?;
                st.mscount = st.mscount.wrapping_add(1);
                Ok(sys::dup(fd.as_fd())?)
            }
            _ => Err(RightsError::InvalidRight(name)),
        }
    }
}
