//! Port attributes (the paper's `rt_mach_port_attr`), chosen when a port is allocated.

use crate::error::AllocateError;

/// A message or thread priority: `0` is timesharing (`SCHED_OTHER`), `1..=99` a
/// fixed `SCHED_FIFO` priority. Higher is more urgent.
pub type Priority = u8;

/// Highest fixed priority Linux has (`sched_get_priority_max(SCHED_FIFO)`).
pub const MAX_PRIORITY: Priority = 99;

/// Most preallocated message buffers one port may have.
pub const MAX_BUFFERS: u32 = 4096;

/// Largest message body a real-time port may carry, in bytes (one datagram).
pub const MAX_MESSAGE: u32 = 64 * 1024;

/// How waiting messages are ordered (the paper's `PRI_FIFO`, `PRI_PRI`, `PRI_BPI`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Queueing {
    /// First come, first served.
    Fifo,
    /// Highest priority first, FIFO among equals.
    Priority,
    /// Priority order, and basic priority inheritance: while a synchronous sender waits,
    /// the receiver serving the port runs at least at the sender's priority, enforced by
    /// the kernel (a PI futex; see `doc/rt-ipc.md`).
    PriorityInheritance,
}

/// How the receiver's priority is set when it is given a message (the paper's
/// `HANDOFF_OFF`, `HANDOFF_ON`, `HANDOFF_MSG`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Handoff {
    /// The receiver keeps its own priority.
    Off,
    /// The receiver takes the sender's priority.
    Sender,
    /// The receiver takes the priority written in the message header.
    Message,
}

/// Which free receiver gets a message when several are waiting (the paper's
/// `DISP_FIFO`, `DISP_WORK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dispatch {
    /// The receiver that has waited longest.
    Arbitrary,
    /// By priority: the lowest-priority waiting receiver whose associated priority is at
    /// least the message's, or else the highest-priority waiting receiver.
    Priority,
}

/// What a real-time port is, fixed at allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortAttrs {
    /// Queue order and inheritance.
    pub queueing: Queueing,
    /// Priority hand-off.
    pub handoff: Handoff,
    /// Receiver selection.
    pub dispatch: Dispatch,
    /// Number of message buffers, allocated with the port.
    pub buffers: u32,
    /// Size of each buffer: the largest message body the port accepts.
    pub buffer_size: u32,
    /// The highest priority a message may claim on this port; claims above it are
    /// lowered to it. A sender states its own priority, so this is what bounds a
    /// hostile sender (see `doc/rt-ipc.md`).
    pub ceiling: Priority,
}

impl PortAttrs {
    /// FIFO queueing, no hand-off: a real-time port that behaves like a plain one.
    pub const FIFO_OFF: PortAttrs = PortAttrs::new(Queueing::Fifo, Handoff::Off);
    /// Priority queueing with hand-off from the sender (the paper's PRIO/ON).
    pub const PRIO_ON: PortAttrs = PortAttrs::new(Queueing::Priority, Handoff::Sender);
    /// Priority queueing, basic priority inheritance and hand-off (the paper's BPI/ON).
    pub const BPI_ON: PortAttrs = PortAttrs::new(Queueing::PriorityInheritance, Handoff::Sender);

    /// These policies with 64 buffers of 4 KiB, arbitrary dispatch and no ceiling.
    pub const fn new(queueing: Queueing, handoff: Handoff) -> PortAttrs {
        PortAttrs {
            queueing,
            handoff,
            dispatch: Dispatch::Arbitrary,
            buffers: 64,
            buffer_size: 4096,
            ceiling: MAX_PRIORITY,
        }
    }

    /// Checks the numbers.
    pub fn validate(&self) -> Result<(), AllocateError> {
        if self.buffers == 0 || self.buffers > MAX_BUFFERS {
            return Err(AllocateError::InvalidValue("buffers must be 1..=4096"));
        }
        if self.buffer_size == 0 || self.buffer_size > MAX_MESSAGE {
            return Err(AllocateError::InvalidValue("buffer size must be 1..=65536 bytes"));
        }
        if self.ceiling > MAX_PRIORITY {
            return Err(AllocateError::InvalidValue("ceiling must be 0..=99"));
        }
        Ok(())
    }

    /// The paper's short name, e.g. `PRIO/ON`.
    pub fn label(&self) -> String {
        let q = match self.queueing {
            Queueing::Fifo => "FIFO",
            Queueing::Priority => "PRIO",
            Queueing::PriorityInheritance => "BPI",
        };
        let h = match self.handoff {
            Handoff::Off => "OFF",
            Handoff::Sender => "ON",
            Handoff::Message => "MSG",
        };
        format!("{q}/{h}")
    }

    /// Encodes the attributes for the connect reply (16 bytes).
    pub fn encode(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[0] = match self.queueing {
            Queueing::Fifo => 0,
            Queueing::Priority => 1,
            Queueing::PriorityInheritance => 2,
        };
        out[1] = match self.handoff {
            Handoff::Off => 0,
            Handoff::Sender => 1,
            Handoff::Message => 2,
        };
        out[2] = match self.dispatch {
            Dispatch::Arbitrary => 0,
            Dispatch::Priority => 1,
        };
        out[3] = self.ceiling;
        out[4..8].copy_from_slice(&self.buffers.to_le_bytes());
        out[8..12].copy_from_slice(&self.buffer_size.to_le_bytes());
        out
    }

    /// Decodes and validates untrusted attribute bytes.
    pub fn decode(raw: &[u8]) -> Option<PortAttrs> {
        if raw.len() != 16 || raw[12..16] != [0; 4] {
            return None;
        }
        let queueing = match raw[0] {
            0 => Queueing::Fifo,
            1 => Queueing::Priority,
            2 => Queueing::PriorityInheritance,
            _ => return None,
        };
        let handoff = match raw[1] {
            0 => Handoff::Off,
            1 => Handoff::Sender,
            2 => Handoff::Message,
            _ => return None,
        };
        let dispatch = match raw[2] {
            0 => Dispatch::Arbitrary,
            1 => Dispatch::Priority,
            _ => return None,
        };
        let attrs = PortAttrs {
            queueing,
            handoff,
            dispatch,
            ceiling: raw[3],
            buffers: u32::from_le_bytes(raw[4..8].try_into().ok()?),
            buffer_size: u32::from_le_bytes(raw[8..12].try_into().ok()?),
        };
        attrs.validate().ok().map(|()| attrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_round_trip_and_reject_nonsense() {
        for q in [Queueing::Fifo, Queueing::Priority, Queueing::PriorityInheritance] {
            for h in [Handoff::Off, Handoff::Sender, Handoff::Message] {
                for d in [Dispatch::Arbitrary, Dispatch::Priority] {
                    let a = PortAttrs { dispatch: d, ..PortAttrs::new(q, h) };
                    assert_eq!(PortAttrs::decode(&a.encode()), Some(a));
                }
            }
        }
        let mut raw = PortAttrs::PRIO_ON.encode();
        raw[0] = 9;
        assert_eq!(PortAttrs::decode(&raw), None);
        let mut raw = PortAttrs::PRIO_ON.encode();
        raw[4..8].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(PortAttrs::decode(&raw), None);
        let mut raw = PortAttrs::PRIO_ON.encode();
        raw[3] = 100;
        assert_eq!(PortAttrs::decode(&raw), None);
        assert_eq!(PortAttrs::decode(&raw[..15]), None);
        assert_eq!(PortAttrs::BPI_ON.label(), "BPI/ON");
        assert!(PortAttrs { buffer_size: MAX_MESSAGE + 1, ..PortAttrs::FIFO_OFF }.validate().is_err());
    }
}
