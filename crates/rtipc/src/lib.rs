//! Real-time IPC for ictus (Kitayama, Nakajima, Tokuda, *RT-IPC: An IPC Extension for
//! Real-Time Mach*, 1993).
//!
//! A **real-time port** is chosen at allocation with the paper's attributes
//! ([`PortAttrs`]): queueing FIFO, by priority, or by priority with basic priority
//! inheritance; hand-off off, from the sender, or from the message header; dispatch to
//! the longest-waiting receiver or by priority; and a number of message buffers of a
//! size, all allocated with the port so that sending and receiving never allocate.
//! Receiver threads [associate](RtSpace::associate) with the port before receiving.
//! A **real-time port set** ([`RtSpace::allocate_set`], [`RtSpace::move_member`])
//! gathers real-time ports: a thread [associated](RtSpace::associate_set) with the set
//! receives from every member, the most urgent message first (by priority across
//! priority-ordered members; a FIFO member's messages count as priority 0 and keep
//! their arrival order), raised and inherited into under the member port's policies.
//! Either way the thread holds a [`Receiver`]: a port's receivers are a set of one.
//! Clients [connect](RtSpace::connect) and [`call`](RtClient::call) (synchronous: the
//! priority follows the request through nested calls) or [`send`](RtClient::send)
//! (asynchronous: only the first receiver is affected).
//!
//! Requests travel as the nucleus's calls do: on the port's main connection, naming the
//! client's connection (kept per client thread), with the kernel's word on the sender,
//! and the receiver waits in one `recvmmsg` there; replies come back through the
//! client's reply pipe.
//!
//! The kernel enforces the priorities: hand-off is `sched_setattr` on the receiver's
//! thread before it is woken (none when it already waits at that priority), and inheritance is a PI futex (`FUTEX_LOCK_PI`) whose
//! owner is the receiver, so Linux's `rt_mutex` chain raises it — and whatever it is
//! itself waiting for — and lowers it again when the waiter leaves or dies.
//! `doc/rt-ipc.md` explains the design and what happens without real-time privileges.
//!
//! ```no_run
//! use ictus_rtipc::{PortAttrs, RtSpace, SendOptions};
//! let rt = RtSpace::new(ictus_ipc::Space::new());
//! let port = rt.allocate(PortAttrs::PRIO_ON)?;
//! let server_rt = rt.clone();
//! std::thread::spawn(move || {
//!     let mut rx = server_rt.associate(port, None).expect("an RT port");
//!     let mut req = rx.request_buffer();
//!     while rx.receive(&mut req, None).is_ok() {
//!         let _ = rx.reply(&mut req, b"done");
//!     }
//! });
//! let mut client = rt.connect(port)?;
//! let mut reply = [0u8; 16];
//! let n = client.call(b"work", &mut reply, SendOptions::default())?;
//! assert_eq!(&reply[..n], b"done");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]

pub mod attr;
mod client;
mod error;
mod group;
mod port;
pub mod prio;
pub mod queue;
mod set;
mod space;
pub mod sys;
pub mod wire;

pub use attr::{Dispatch, Handoff, PortAttrs, Priority, Queueing, MAX_BUFFERS, MAX_MESSAGE, MAX_PRIORITY};
pub use client::{RtClient, SendOptions};
pub use error::{AllocateError, AssociateError, MemberError, ReceiveError, ReplyError, SendError};
pub use group::{Receiver, GRACE};
pub use port::{PortStats, Request, MAX_CONNECTIONS, MAX_RECEIVERS};
pub use set::MAX_MEMBERS;
pub use space::{RtSpace, DEFAULT_CONNECT_TIMEOUT};
