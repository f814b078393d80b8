//! Port sets: one epoll over the member ports' own epolls.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::port::RecvPort;
use crate::sys::{self, Interest};

static NEXT_SET_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct PortSet {
    #[allow(dead_code)]
    pub(crate) id: u64,
    pub(crate) ep: OwnedFd,
    pub(crate) members: Mutex<HashMap<u64, Weak<RecvPort>>>,
}

impl PortSet {
    pub(crate) fn new() -> rustix::io::Result<Arc<PortSet>> {
        Ok(Arc::new(PortSet {
            id: NEXT_SET_ID.fetch_add(1, Ordering::Relaxed),
            ep: sys::epoll()?,
            members: Mutex::new(HashMap::new()),
        }))
    }

    pub(crate) fn add(self: &Arc<Self>, port: &Arc<RecvPort>) -> rustix::io::Result<()> {
        let port_ep = {
            let mut st = port.lock();
            let ep = st.ensure_epoll()?;
            st.set = Some(Arc::downgrade(self));
            ep
        };
        sys::epoll_add(self.ep.as_fd(), port_ep.as_fd(), port.id, Interest::Readable)?;
        self.members.lock().unwrap_or_else(|e| e.into_inner()).insert(port.id, Arc::downgrade(port));
        Ok(())
    }

    pub(crate) fn remove(&self, port: &RecvPort) {
        let ep = {
            let mut st = port.lock();
            st.set = None;
            st.epoll.clone()
        };
        if let Some(ep) = ep {
            sys::epoll_delete(self.ep.as_fd(), ep.as_fd());
        }
        self.members.lock().unwrap_or_else(|e| e.into_inner()).remove(&port.id);
    }

    pub(crate) fn member(&self, id: u64) -> Option<Arc<RecvPort>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner()).get(&id).and_then(Weak::upgrade)
    }

    pub(crate) fn member_names(&self) -> Vec<ictus_abi::Name> {
        self.members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter_map(Weak::upgrade)
            .map(|p| p.name())
            .collect()
    }
}
