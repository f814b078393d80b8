//! Port names: small integers local to one task's name space, as in Mach.

use std::fmt;

/// A port name in a task's name space.
///
/// Like Mach's `mach_port_name_t`, a name is an index into the task's table combined
/// with a generation number, so that a name that was deallocated and whose slot was
/// reused does not silently denote the new right: the stale name fails with
/// `KERN_INVALID_NAME`. Names mean nothing outside the task that holds them; they are
/// never sent on the wire as a way to reach a port (rights travel as descriptors).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(pub u32);

/// The index part of a [`Name`].
pub type NameIndex = u32;

impl Name {
    /// `MACH_PORT_NULL`: no port.
    pub const NULL: Name = Name(0);
    /// `MACH_PORT_DEAD`: a right whose port has died, where a name is expected.
    pub const DEAD: Name = Name(u32::MAX);
    /// Bits of a name that hold the generation.
    pub const GEN_BITS: u32 = 8;

    /// Build a name from a table index and a generation (1..=255).
    pub const fn new(index: NameIndex, gen: u8) -> Name {
        Name((index << Self::GEN_BITS) | gen as u32)
    }

    /// The table index of this name.
    pub const fn index(self) -> NameIndex {
        self.0 >> Self::GEN_BITS
    }

    /// The generation of this name.
    pub const fn generation(self) -> u8 {
        (self.0 & 0xff) as u8
    }

    /// Whether this is a real name (neither NULL nor DEAD).
    pub const fn is_valid(self) -> bool {
        self.0 != 0 && self.0 != u32::MAX
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Name::NULL => write!(f, "Name(NULL)"),
            Name::DEAD => write!(f, "Name(DEAD)"),
            n => write!(f, "Name({:#x})", n.0),
        }
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_and_generation_round_trip() {
        let n = Name::new(0x12345, 7);
        assert_eq!(n.index(), 0x12345);
        assert_eq!(n.generation(), 7);
        assert!(n.is_valid());
        assert!(!Name::NULL.is_valid());
        assert!(!Name::DEAD.is_valid());
    }
}
