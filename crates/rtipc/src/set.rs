//! Real-time port sets: a receiver group ([`Group`]) whose members are real-time ports.
//!
//! A set is one `epoll` over its members' main connections (level-triggered: a member
//! with datagrams queued is ready) plus an `eventfd` to wake the receiver polling it.
//! Each member keeps its connections and its queue of preallocated buffers; the set's
//! receivers read every member into its own queue and take the most urgent message
//! across them (`group.rs`). A port in a set has no receivers of its own, so only the
//! set's receivers ever take from its queue (under the set's lock, then the port's:
//! always in that order; a port's own group's lock comes between the two when a port
//! moves in).

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ictus_ipc::Name;
use rustix::event::epoll;

use crate::error::MemberError;
use crate::group::Group;
use crate::port::{PortInner, W_BUSY, W_POLLER, W_POLLER_AT};

/// Most ports one real-time port set may hold.
pub const MAX_MEMBERS: usize = 64;

impl Group {
    /// The member ports' names.
    pub(crate) fn member_names(&self) -> Vec<Name> {
        self.lock().members.iter().map(|(n, _)| *n).collect()
    }

    /// Whether `port` is a member.
    pub(crate) fn contains(&self, port: &Arc<PortInner>) -> bool {
        self.lock().members.iter().any(|(_, p)| Arc::ptr_eq(p, port))
    }

    /// Adds a port that is in no set and has no receivers of its own (its own group,
    /// `own`, has none).
    pub(crate) fn add(&self, name: Name, port: &Arc<PortInner>, own: &Group) -> Result<(), MemberError> {
        let Some(ep) = self.epoll() else { return Err(MemberError::InvalidRight(name)) };
        let mut st = self.lock();
        if self.dead.load(Ordering::SeqCst) {
            return Err(MemberError::InvalidRight(name));
        }
        if st.members.len() >= MAX_MEMBERS {
            return Err(MemberError::Full);
        }
        {
            let own_st = own.lock();
            if own.receiver_count_locked(&own_st) > 0 {
                return Err(MemberError::Associated(name));
            }
            let mut ps = port.lock();
            epoll::add(ep, port.main_recv().as_fd(), epoll::EventData::new_u64(0), epoll::EventFlags::IN)
                .map_err(std::io::Error::from)?;
            ps.in_set = true;
        }
        st.members.push((name, Arc::clone(port)));
        self.kick(&st);
        Ok(())
    }

    /// Takes a port out of the set: messages given to a set receiver but not yet taken
    /// go back to the port's queue, and the set's receivers leave its status page.
    pub(crate) fn remove(&self, port: &Arc<PortInner>) -> bool {
        let mut st = self.lock();
        let Some(i) = st.members.iter().position(|(_, p)| Arc::ptr_eq(p, port)) else { return false };
        let (_, port) = st.members.remove(i);
        if let Some(ep) = self.epoll() {
            let _ = epoll::delete(ep, port.main_recv().as_fd());
        }
        self.give_back(&mut st, &port);
        port.lock().in_set = false;
        // The port has no receivers of its own: nobody of it polls or serves now.
        for w in [W_POLLER, W_POLLER_AT, W_BUSY] {
            port.status.word(w).store(0, Ordering::SeqCst);
        }
        self.kick(&st);
        true
    }

    /// Destroys the set: its receivers get `PortDied`, its members leave it (they live on).
    pub(crate) fn destroy_set(&self) {
        if self.dead.swap(true, Ordering::SeqCst) {
            return;
        }
        let members: Vec<Arc<PortInner>> = self.lock().members.iter().map(|(_, p)| Arc::clone(p)).collect();
        for p in &members {
            self.remove(p);
        }
        self.wake_all();
    }
}
