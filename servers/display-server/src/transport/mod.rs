//! The three transports, one thread each, all executing requests through
//! [`Session::execute`](crate::core::Session::execute) on the shared
//! [`Core`](crate::core::Core):
//!
//! - [`shm`]: every client's shared-memory ring, one server flag, `futex_waitv`;
//! - [`port`]: the service port and the port clients' request ports, on the server
//!   skeleton's loop;
//! - [`socket`]: a listening stream socket and its connections, in one epoll.

pub(crate) mod port;
pub(crate) mod shm;
pub(crate) mod socket;

use crate::core::{lock, Out, Outbox};

/// Take up to `max` bytes of plain messages from an outbox, in order.
pub(crate) fn take_msgs(outbox: &Outbox, max: usize) -> Vec<u8> {
    let mut q = lock(&outbox.q);
    let mut bytes = Vec::new();
    while let Some(Out::Msg(m)) = q.front() {
        if !bytes.is_empty() && bytes.len() + m.len() > max {
            break;
        }
        let Some(Out::Msg(m)) = q.pop_front() else { unreachable!() };
        bytes.extend_from_slice(&m);
    }
    bytes
}

pub(crate) fn put_back(outbox: &Outbox, bytes: Vec<u8>) {
    if !bytes.is_empty() {
        lock(&outbox.q).push_front(Out::Msg(bytes));
    }
}
