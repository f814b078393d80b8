//! The name table of one space: names to rights, with user-reference counts.
//!
//! Pure bookkeeping over already-open descriptors; no system calls.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use ictus_abi::Name;

use crate::error::RightsError;
use crate::port::{ChannelKey, Ident, RecvPort};
use crate::set::PortSet;

/// Most user references one name may hold (Mach's `MACH_PORT_UREFS_MAX`).
pub const UREFS_MAX: u32 = 65_534;
/// Most names one space may hold.
pub const MAX_NAMES: usize = 1 << 20;

pub(crate) struct SendRef {
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) urefs: u32,
}

pub(crate) struct PortEntry {
    pub(crate) send: Option<SendRef>,
    pub(crate) recv: Option<Arc<RecvPort>>,
    pub(crate) ident: Option<Ident>,
}

/// A send-once right: its own connection, or a client's call channel that the port
/// keeps (then `channel` names the port, by its id, and the channel's key).
pub(crate) struct SendOnce {
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) channel: Option<(u64, ChannelKey)>,
    /// The kept channel's reply pipe, for a reply of in-line data only.
    pub(crate) pipe: Option<Arc<OwnedFd>>,
}

impl SendOnce {
    pub(crate) fn plain(fd: Arc<OwnedFd>) -> SendOnce {
        SendOnce { fd, channel: None, pipe: None }
    }
}

pub(crate) enum Entry {
    Port(PortEntry),
    SendOnce(SendOnce),
    Set(Arc<PortSet>),
    Dead(u32),
}

struct Slot {
    gen: u8,
    entry: Option<Entry>,
    /// Held out of the table while a send that moves it is under way.
    reserved: bool,
}

#[derive(Default)]
pub(crate) struct Table {
    slots: Vec<Slot>,
    free: Vec<u32>,
    by_ident: HashMap<Ident, u32>,
}

fn next_gen(g: u8) -> u8 {
    if g == u8::MAX {
        1
    } else {
        g + 1
    }
}

impl Table {
    pub(crate) fn new() -> Table {
        // Index 0 is never used, so that no name is MACH_PORT_NULL.
        Table { slots: vec![Slot { gen: 1, entry: None, reserved: true }], ..Table::default() }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len() - 1 - self.free.len()
    }

    fn name_of(&self, index: u32) -> Name {
        Name::new(index, self.slots[index as usize].gen)
    }

    pub(crate) fn alloc(&mut self, entry: Entry) -> Result<Name, RightsError> {
        let index = if let Some(i) = self.free.pop() {
            i
        } else {
            if self.slots.len() >= MAX_NAMES {
                return Err(RightsError::NoSpace);
            }
            self.slots.push(Slot { gen: 1, entry: None, reserved: false });
            (self.slots.len() - 1) as u32
        };
        self.index_entry(index, &entry);
        self.slots[index as usize].entry = Some(entry);
        Ok(self.name_of(index))
    }

    /// Put an entry under a name the caller chose (insert-right).
    pub(crate) fn alloc_at(&mut self, name: Name, entry: Entry) -> Result<(), RightsError> {
        if !name.is_valid() || name.generation() == 0 {
            return Err(RightsError::InvalidValue);
        }
        let index = name.index();
        if index as usize >= MAX_NAMES {
            return Err(RightsError::InvalidValue);
        }
        while self.slots.len() <= index as usize {
            let i = self.slots.len() as u32;
            self.slots.push(Slot { gen: 1, entry: None, reserved: false });
            self.free.push(i);
        }
        let slot = &self.slots[index as usize];
        if slot.entry.is_some() || slot.reserved {
            return Err(RightsError::NameExists(name));
        }
        self.free.retain(|&i| i != index);
        self.slots[index as usize].gen = name.generation();
        self.index_entry(index, &entry);
        self.slots[index as usize].entry = Some(entry);
        Ok(())
    }

    /// Whether `name` could be given to a new right (see [`Table::alloc_at`]).
    pub(crate) fn check_free(&self, name: Name) -> Result<(), RightsError> {
        if !name.is_valid() || name.generation() == 0 || name.index() as usize >= MAX_NAMES {
            return Err(RightsError::InvalidValue);
        }
        match self.slots.get(name.index() as usize) {
            Some(slot) if slot.entry.is_some() || slot.reserved => Err(RightsError::NameExists(name)),
            _ => Ok(()),
        }
    }

    fn index_entry(&mut self, index: u32, entry: &Entry) {
        if let Entry::Port(p) = entry {
            if let Some(id) = p.ident {
                self.by_ident.insert(id, index);
            }
        }
    }

    fn check(&self, name: Name) -> Result<usize, RightsError> {
        let i = name.index() as usize;
        match self.slots.get(i) {
            Some(s) if i != 0 && s.gen == name.generation() && s.entry.is_some() => Ok(i),
            _ => Err(RightsError::InvalidName(name)),
        }
    }

    pub(crate) fn get(&self, name: Name) -> Result<&Entry, RightsError> {
        let i = self.check(name)?;
        Ok(self.slots[i].entry.as_ref().expect("checked"))
    }

    /// The receive right of the port with this id, if this space holds it (a walk over
    /// the table: only for rare operations).
    pub(crate) fn receive_right_by_id(&self, id: u64) -> Option<Arc<RecvPort>> {
        self.slots.iter().find_map(|s| match &s.entry {
            Some(Entry::Port(PortEntry { recv: Some(p), .. })) if p.id == id => Some(p.clone()),
            _ => None,
        })
    }

    pub(crate) fn get_mut(&mut self, name: Name) -> Result<&mut Entry, RightsError> {
        let i = self.check(name)?;
        Ok(self.slots[i].entry.as_mut().expect("checked"))
    }

    /// Remove a name entirely; its slot may be reused under a new generation.
    pub(crate) fn remove(&mut self, name: Name) -> Result<Entry, RightsError> {
        let i = self.check(name)?;
        let e = self.slots[i].entry.take().expect("checked");
        self.unindex(i as u32, &e);
        self.slots[i].gen = next_gen(self.slots[i].gen);
        self.free.push(i as u32);
        Ok(e)
    }

    /// Take an entry out, keeping its name reserved until [`Table::restore`] or
    /// [`Table::release`].
    pub(crate) fn reserve(&mut self, name: Name) -> Result<Entry, RightsError> {
        let i = self.check(name)?;
        let e = self.slots[i].entry.take().expect("checked");
        self.unindex(i as u32, &e);
        self.slots[i].reserved = true;
        Ok(e)
    }

    pub(crate) fn restore(&mut self, name: Name, entry: Entry) {
        let i = name.index() as usize;
        self.index_entry(i as u32, &entry);
        self.slots[i].entry = Some(entry);
        self.slots[i].reserved = false;
    }

    pub(crate) fn release(&mut self, name: Name) {
        let i = name.index() as usize;
        self.slots[i].reserved = false;
        self.slots[i].gen = next_gen(self.slots[i].gen);
        self.free.push(i as u32);
    }

    fn unindex(&mut self, index: u32, e: &Entry) {
        if let Entry::Port(p) = e {
            if let Some(id) = p.ident {
                if self.by_ident.get(&id) == Some(&index) {
                    self.by_ident.remove(&id);
                }
            }
        }
    }

    /// Drop the identity index of a name (its send right died or left).
    pub(crate) fn forget_ident(&mut self, name: Name) {
        let i = name.index();
        if let Ok(Entry::Port(p)) = self.get_mut(name) {
            if let Some(id) = p.ident.take() {
                if self.by_ident.get(&id) == Some(&i) {
                    self.by_ident.remove(&id);
                }
            }
        }
    }

    pub(crate) fn set_ident(&mut self, name: Name, ident: Ident) {
        let i = name.index();
        if let Ok(Entry::Port(p)) = self.get_mut(name) {
            p.ident = Some(ident);
            self.by_ident.insert(ident, i);
        }
    }

    /// The name that already denotes the port with this send identity, if any.
    pub(crate) fn lookup_ident(&self, ident: Ident) -> Option<Name> {
        self.by_ident.get(&ident).map(|&i| self.name_of(i))
    }

    /// Insert a received send right, merging it with a name that already denotes the
    /// same port. Returns the name, or `UrefsOverflow` if the name's references are at
    /// their limit (the right is then dropped).
    pub(crate) fn insert_send(&mut self, fd: OwnedFd, ident: Ident) -> Result<Name, RightsError> {
        if let Some(name) = self.lookup_ident(ident) {
            if let Ok(Entry::Port(p)) = self.get_mut(name) {
                match &mut p.send {
                    Some(s) => {
                        if s.urefs >= UREFS_MAX {
                            return Err(RightsError::UrefsOverflow(name));
                        }
                        s.urefs += 1;
                    }
                    None => p.send = Some(SendRef { fd: Arc::new(fd), urefs: 1 }),
                }
                return Ok(name);
            }
        }
        self.alloc(Entry::Port(PortEntry {
            send: Some(SendRef { fd: Arc::new(fd), urefs: 1 }),
            recv: None,
            ident: Some(ident),
        }))
    }

    /// Insert a received receive right, merging it with a send right this space holds
    /// for the same port.
    pub(crate) fn insert_receive(&mut self, port: Arc<RecvPort>, ident: Option<Ident>) -> Result<Name, RightsError> {
        if let Some(ident) = ident {
            if let Some(name) = self.lookup_ident(ident) {
                if let Ok(Entry::Port(p)) = self.get_mut(name) {
                    if p.recv.is_none() {
                        port.name.store(name.0, std::sync::atomic::Ordering::Relaxed);
                        p.recv = Some(port);
                        return Ok(name);
                    }
                }
            }
        }
        let name = self.alloc(Entry::Port(PortEntry { send: None, recv: Some(port.clone()), ident }))?;
        port.name.store(name.0, std::sync::atomic::Ordering::Relaxed);
        Ok(name)
    }

    /// All names, for listing and teardown.
    pub(crate) fn names(&self) -> Vec<Name> {
        (1..self.slots.len()).filter(|&i| self.slots[i].entry.is_some()).map(|i| self.name_of(i as u32)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::RecvPort;

    /// Any descriptor will do: the table never looks at it.
    fn fd() -> OwnedFd {
        rustix::pipe::pipe().expect("pipe").0
    }

    fn send(t: &mut Table, ident: Ident) -> Name {
        t.insert_send(fd(), ident).expect("room")
    }

    fn urefs(t: &Table, name: Name) -> u32 {
        match t.get(name) {
            Ok(Entry::Port(PortEntry { send: Some(s), .. })) => s.urefs,
            _ => 0,
        }
    }

    #[test]
    fn names_are_never_null_and_a_freed_name_is_not_reused_as_is() {
        let mut t = Table::new();
        assert_eq!(t.len(), 0);
        let a = t.alloc(Entry::Dead(1)).unwrap();
        assert_ne!(a, Name::NULL);
        assert!(a.is_valid());
        assert!(matches!(t.get(Name::NULL), Err(RightsError::InvalidName(_))));
        t.remove(a).unwrap();
        let b = t.alloc(Entry::Dead(1)).unwrap();
        assert_eq!(b.index(), a.index(), "the slot is reused");
        assert_ne!(b, a, "under a new generation");
        assert!(matches!(t.get(a), Err(RightsError::InvalidName(n)) if n == a), "the old name reaches nothing");
        assert!(matches!(t.remove(a), Err(RightsError::InvalidName(_))));
        assert_eq!((t.len(), t.names()), (1, vec![b]));
    }

    #[test]
    fn generations_wrap_without_ever_being_zero() {
        let mut t = Table::new();
        let mut name = t.alloc(Entry::Dead(1)).unwrap();
        for _ in 0..600 {
            t.remove(name).unwrap();
            name = t.alloc(Entry::Dead(1)).unwrap();
            assert_ne!(name.generation(), 0);
        }
    }

    #[test]
    fn a_chosen_name_is_taken_once_and_only_if_valid() {
        let mut t = Table::new();
        let name = Name::new(40, 3);
        t.check_free(name).unwrap();
        t.alloc_at(name, Entry::Dead(1)).unwrap();
        assert!(matches!(t.get(name), Ok(Entry::Dead(1))));
        assert_eq!(t.check_free(name), Err(RightsError::NameExists(name)));
        assert_eq!(t.alloc_at(name, Entry::Dead(1)), Err(RightsError::NameExists(name)));
        assert_eq!(t.alloc_at(Name::new(41, 0), Entry::Dead(1)), Err(RightsError::InvalidValue));
        assert_eq!(t.alloc_at(Name::NULL, Entry::Dead(1)), Err(RightsError::InvalidValue));
        // The slots skipped on the way are free for ordinary allocation, the chosen one not.
        let others: Vec<Name> = (0..39).map(|_| t.alloc(Entry::Dead(1)).unwrap()).collect();
        assert!(others.iter().all(|n| n.index() != 40 && n.index() != 0));
        assert_eq!(t.len(), 40);
    }

    #[test]
    fn a_reserved_name_is_held_until_restored_or_released() {
        let mut t = Table::new();
        let name = t.alloc(Entry::Dead(2)).unwrap();
        let e = t.reserve(name).unwrap();
        assert!(t.get(name).is_err(), "out of the table while reserved");
        assert_eq!(t.check_free(name), Err(RightsError::NameExists(name)), "and not to be taken");
        let other = t.alloc(Entry::Dead(1)).unwrap();
        assert_ne!(other.index(), name.index(), "nor reused");
        t.restore(name, e);
        assert!(matches!(t.get(name), Ok(Entry::Dead(2))));
        let _ = t.reserve(name).unwrap();
        t.release(name);
        assert!(t.get(name).is_err());
        let again = t.alloc(Entry::Dead(1)).unwrap();
        assert_eq!(again.index(), name.index(), "a released name's slot is reused");
        assert_ne!(again, name, "under a new generation");
    }

    #[test]
    fn send_rights_to_one_port_share_a_name() {
        let mut t = Table::new();
        let (p, q) = ((1, 10), (1, 11));
        let a = send(&mut t, p);
        assert_eq!(send(&mut t, p), a, "same identity, same name");
        assert_eq!(urefs(&t, a), 2);
        let b = send(&mut t, q);
        assert_ne!(a, b);
        assert_eq!(t.lookup_ident(p), Some(a));
        // A name whose right died is forgotten by identity: the port's next right gets
        // a new name.
        t.forget_ident(a);
        assert_eq!(t.lookup_ident(p), None);
        let c = send(&mut t, p);
        assert_ne!(c, a);
        assert_eq!(urefs(&t, c), 1);
        // Removing a name removes its identity, unless the identity moved on.
        t.remove(b).unwrap();
        assert_eq!(t.lookup_ident(q), None);
    }

    #[test]
    fn user_references_stop_at_their_limit() {
        let mut t = Table::new();
        let a = send(&mut t, (2, 2));
        if let Ok(Entry::Port(PortEntry { send: Some(s), .. })) = t.get_mut(a) {
            s.urefs = UREFS_MAX;
        }
        assert_eq!(t.insert_send(fd(), (2, 2)), Err(RightsError::UrefsOverflow(a)));
        assert_eq!(urefs(&t, a), UREFS_MAX);
    }

    #[test]
    fn a_receive_right_joins_the_name_of_a_send_right_to_its_port() {
        let mut t = Table::new();
        let port = RecvPort::new().unwrap();
        let ident = port.lock().ident.expect("a new port has a send source");
        let a = send(&mut t, ident);
        let r = t.insert_receive(port.clone(), Some(ident)).unwrap();
        assert_eq!(r, a);
        assert_eq!(port.name(), a, "the port knows its name");
        assert!(matches!(t.get(a), Ok(Entry::Port(PortEntry { send: Some(_), recv: Some(_), .. }))));
        assert_eq!(t.receive_right_by_id(port.id).map(|p| p.id), Some(port.id));
        // Without an identity it gets a name of its own.
        let other = RecvPort::new().unwrap();
        let b = t.insert_receive(other.clone(), None).unwrap();
        assert_ne!(b, a);
        assert_eq!(other.name(), b);
    }

    proptest::proptest! {
        /// Whatever the order of allocations and removals: live names are distinct and
        /// reach their own entries, removed names reach nothing, and the count is right.
        #[test]
        fn live_names_are_distinct_and_dead_ones_reach_nothing(ops in proptest::collection::vec(0u8..4, 1..300)) {
            let mut t = Table::new();
            let mut live: Vec<(Name, u32)> = Vec::new();
            let mut gone: Vec<Name> = Vec::new();
            for (i, op) in ops.into_iter().enumerate() {
                if op == 0 && !live.is_empty() {
                    let (name, _) = live.remove(i % live.len());
                    t.remove(name).unwrap();
                    gone.push(name);
                } else {
                    let tag = i as u32 + 1;
                    live.push((t.alloc(Entry::Dead(tag)).unwrap(), tag));
                }
            }
            proptest::prop_assert_eq!(t.len(), live.len());
            for &(name, tag) in &live {
                proptest::prop_assert!(matches!(t.get(name), Ok(Entry::Dead(n)) if *n == tag));
            }
            for name in gone {
                proptest::prop_assert!(t.get(name).is_err());
            }
            let mut names = t.names();
            names.sort();
            let mut want: Vec<Name> = live.iter().map(|(n, _)| *n).collect();
            want.sort();
            proptest::prop_assert_eq!(names, want);
        }
    }

    #[test]
    fn chosen_names_beyond_the_table_limit_are_refused() {
        let mut t = Table::new();
        let far = Name::new(MAX_NAMES as u32, 1);
        assert_eq!(t.check_free(far), Err(RightsError::InvalidValue));
        assert_eq!(t.alloc_at(far, Entry::Dead(1)), Err(RightsError::InvalidValue));
    }
}
