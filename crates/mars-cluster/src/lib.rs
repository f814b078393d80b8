//! MARS across machines (issue 20), the pure core of the director: no sockets, no
//! clock of its own — every call is given the time (ns on any monotonic clock), so tests
//! run on a virtual clock and the same code runs the real director.
//!
//! - **Placement** ([`Director::place`]): a stream goes to a live node with room for its
//!   rate, preferring nodes that report the clip's stripes cached (they read nothing
//!   from the shared store), then the node left least loaded (as a fraction of its
//!   capacity), then the lowest node id (deterministic).
//! - **Admission, cluster-wide**: a node takes streams up to its capacity (its measured
//!   sending rate); the shared store (the Ceph cluster) serves streams whose node does
//!   not have the clip cached, up to the store's measured rate. A stream that fits
//!   neither is refused, with which limit refused it.
//! - **Failover** ([`Director::tick`], [`Director::node_lost`]): a node silent for longer
//!   than the heartbeat timeout, or reported lost (its connection hung up: the dead-name
//!   notification of a port), is dead; each of its streams is placed again, resuming at
//!   the position its schedule had reached, or dropped if no node has room. Either way
//!   the caller is told ([`Moved`]) so the client can be redirected.
#![deny(unsafe_code)]

pub mod director;
pub mod key;
pub mod service;
pub mod wire;

pub use director::{Config, Director, Moved, NodeId, NodeState, Placement, Refused, StreamId, CACHE_BOUND_PCT};
pub use key::{ClusterKey, KeyError};
