//! The pure core: a queue of preallocated message buffers, ordered FIFO or by priority,
//! and the choice of a receiver. No system calls; the port drives it.
//!
//! A reserved buffer can be lent out ([`MessageQueue::lend`]) and given back
//! ([`MessageQueue::give_back`]): the port's receiver reads the kernel's queue straight
//! into it without holding the port's lock while it waits.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::attr::{Dispatch, Priority, Queueing};

/// Arrival numbers are process-wide, so that the messages of different ports (the
/// members of a port set) can be ordered by arrival too.
static ARRIVALS: AtomicU64 = AtomicU64::new(0);

/// A message waiting in the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its buffer.
    pub slot: u32,
    /// The connection it came on (the port's token for it).
    pub conn: u64,
    /// Its priority (already capped by the port's ceiling).
    pub priority: Priority,
    /// Arrival order, for FIFO and for ties (process-wide: comparable across queues).
    pub arrival: u64,
    /// The sender's sequence number.
    pub seq: u32,
    /// Whether the sender waits for a reply.
    pub sync: bool,
    /// Body length.
    pub len: u32,
}

/// Why a message could not be queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// Every buffer is in use.
    #[error("every message buffer is in use")]
    Full,
    /// The body is larger than a buffer.
    #[error("message of {0} bytes is larger than the port's buffers")]
    TooLarge(usize),
}

/// A fixed set of buffers, all allocated up front, and the messages waiting in them.
#[derive(Debug)]
pub struct MessageQueue {
    order: Queueing,
    size: usize,
    /// One buffer per slot; a lent slot's is empty until it comes back.
    storage: Vec<Box<[u8]>>,
    free: Vec<u32>,
    /// Sorted so that the next message to take is last.
    waiting: Vec<Entry>,
}

impl MessageQueue {
    /// `buffers` buffers of `size` bytes, ordered by `order`. All memory is allocated here.
    pub fn new(order: Queueing, buffers: u32, size: u32) -> MessageQueue {
        let n = buffers as usize;
        MessageQueue {
            order,
            size: size as usize,
            storage: (0..n).map(|_| vec![0u8; size as usize].into_boxed_slice()).collect(),
            free: (0..buffers).rev().collect(),
            waiting: Vec::with_capacity(n),
        }
    }

    /// Free buffers.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Takes a free buffer to receive into; give it back with [`MessageQueue::commit`]
    /// or [`MessageQueue::release`].
    pub fn reserve(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// The size of each buffer.
    pub fn buffer_size(&self) -> usize {
        self.size
    }

    /// The bytes of a buffer (empty while it is lent out).
    pub fn buffer_mut(&mut self, slot: u32) -> &mut [u8] {
        &mut self.storage[slot as usize]
    }

    /// The first `len` bytes of a buffer.
    pub fn body(&self, slot: u32, len: u32) -> &[u8] {
        let b = &self.storage[slot as usize];
        &b[..(len as usize).min(b.len())]
    }

    /// Lends a reserved buffer out (its slot keeps an empty one): the caller fills it
    /// without the queue, then gives it back with [`MessageQueue::give_back`]. Never
    /// allocates.
    pub fn lend(&mut self, slot: u32) -> Box<[u8]> {
        std::mem::take(&mut self.storage[slot as usize])
    }

    /// Gives a lent buffer back to its slot (still reserved: then commit or release it).
    pub fn give_back(&mut self, slot: u32, buf: Box<[u8]>) {
        debug_assert!(self.storage[slot as usize].is_empty());
        self.storage[slot as usize] = buf;
    }

    /// Returns a reserved or taken buffer to the free list.
    pub fn release(&mut self, slot: u32) {
        debug_assert!(!self.free.contains(&slot));
        self.free.push(slot);
    }

    /// Queues the message in a reserved buffer. Never allocates.
    pub fn commit(
        &mut self,
        slot: u32,
        conn: u64,
        priority: Priority,
        seq: u32,
        sync: bool,
        len: u32,
    ) -> Result<(), QueueError> {
        if len as usize > self.size {
            self.release(slot);
            return Err(QueueError::TooLarge(len as usize));
        }
        let arrival = ARRIVALS.fetch_add(1, Ordering::Relaxed) + 1;
        let e = Entry { slot, conn, priority, arrival, seq, sync, len };
        // Keep the next message last: ascending "urgency".
        let key = |x: &Entry| self.key(x);
        let k = key(&e);
        let pos = self.waiting.partition_point(|x| key(x) < k);
        self.waiting.insert(pos, e);
        Ok(())
    }

    /// Copies a body into a reserved buffer and queues it (for tests and in-process use).
    pub fn push(&mut self, conn: u64, priority: Priority, seq: u32, sync: bool, body: &[u8]) -> Result<(), QueueError> {
        if body.len() > self.size {
            return Err(QueueError::TooLarge(body.len()));
        }
        let slot = self.reserve().ok_or(QueueError::Full)?;
        self.buffer_mut(slot)[..body.len()].copy_from_slice(body);
        self.commit(slot, conn, priority, seq, sync, body.len() as u32)
    }

    fn key(&self, e: &Entry) -> (u8, u64) {
        order_key(self.order, e)
    }

    /// The next message, without taking it.
    pub fn peek(&self) -> Option<&Entry> {
        self.waiting.last()
    }

    /// Takes the next message; its buffer stays in use until [`MessageQueue::release`].
    pub fn pop(&mut self) -> Option<Entry> {
        self.waiting.pop()
    }

    /// The waiting messages, next last.
    pub fn waiting(&self) -> &[Entry] {
        &self.waiting
    }

    /// Drops every message from a connection (its sender is gone) and frees their
    /// buffers; returns how many.
    pub fn remove_conn(&mut self, conn: u64) -> usize {
        let before = self.waiting.len();
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].conn == conn {
                let e = self.waiting.remove(i);
                self.free.push(e.slot);
            } else {
                i += 1;
            }
        }
        before - self.waiting.len()
    }
}

/// The order of messages: a higher key is taken sooner. A FIFO queue ignores priorities
/// (every message counts as priority 0), a priority queue orders by priority; earlier
/// arrival first among equals. A port set compares its members' next messages with the
/// same key, each under its own port's queueing.
pub fn order_key(order: Queueing, e: &Entry) -> (u8, u64) {
    // Earlier arrival = larger `!arrival`.
    match order {
        Queueing::Fifo => (0, !e.arrival),
        Queueing::Priority | Queueing::PriorityInheritance => (e.priority, !e.arrival),
    }
}

/// A receiver waiting for a message: its id and associated priority, in the order they
/// started waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// The receiver.
    pub id: usize,
    /// Its associated priority.
    pub priority: Priority,
}

/// Chooses which waiting receiver gets a message of `priority` (index into `waiting`).
pub fn choose_receiver(policy: Dispatch, waiting: &[Waiting], priority: Priority) -> Option<usize> {
    match policy {
        Dispatch::Arbitrary => (!waiting.is_empty()).then_some(0),
        Dispatch::Priority => {
            let fitting = waiting
                .iter()
                .enumerate()
                .filter(|(_, w)| w.priority >= priority)
                .min_by_key(|(i, w)| (w.priority, *i))
                .map(|(i, _)| i);
            fitting.or_else(|| {
                waiting.iter().enumerate().max_by_key(|(i, w)| (w.priority, std::cmp::Reverse(*i))).map(|(i, _)| i)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fifo_ignores_priority_prio_orders_by_it() {
        let mut q = MessageQueue::new(Queueing::Fifo, 4, 8);
        q.push(1, 10, 0, true, b"a").expect("room");
        q.push(2, 90, 0, true, b"b").expect("room");
        q.push(3, 50, 0, true, b"c").expect("room");
        let order: Vec<u64> = std::iter::from_fn(|| q.pop().map(|e| e.conn)).collect();
        assert_eq!(order, [1, 2, 3]);

        let mut q = MessageQueue::new(Queueing::Priority, 4, 8);
        q.push(1, 10, 0, true, b"a").expect("room");
        q.push(2, 90, 0, true, b"b").expect("room");
        q.push(3, 50, 0, true, b"c").expect("room");
        q.push(4, 90, 0, true, b"d").expect("room");
        assert_eq!(q.push(5, 1, 0, true, b"e"), Err(QueueError::Full));
        let e = q.pop().expect("one");
        assert_eq!((e.conn, q.body(e.slot, e.len)), (2, &b"b"[..]));
        q.release(e.slot);
        let order: Vec<u64> = std::iter::from_fn(|| q.pop().map(|e| e.conn)).collect();
        assert_eq!(order, [4, 3, 1]);
    }

    #[test]
    fn a_dead_sender_frees_its_buffers() {
        let mut q = MessageQueue::new(Queueing::Priority, 3, 8);
        q.push(7, 1, 0, false, b"x").expect("room");
        q.push(8, 2, 0, false, b"y").expect("room");
        q.push(7, 3, 1, false, b"z").expect("room");
        assert_eq!(q.free(), 0);
        assert_eq!(q.remove_conn(7), 2);
        assert_eq!(q.free(), 2);
        assert_eq!(q.pop().map(|e| e.conn), Some(8));
        assert_eq!(q.push(1, 0, 0, false, &[0; 9]), Err(QueueError::TooLarge(9)));
    }

    #[test]
    fn a_lent_buffer_comes_back_with_its_message() {
        let mut q = MessageQueue::new(Queueing::Priority, 2, 8);
        let slot = q.reserve().expect("room");
        let mut b = q.lend(slot);
        assert_eq!(b.len(), 8);
        b[..2].copy_from_slice(b"hi");
        q.give_back(slot, b);
        q.commit(slot, 5, 3, 1, true, 2).expect("queued");
        let e = q.pop().expect("one");
        assert_eq!((e.conn, q.body(e.slot, e.len)), (5, &b"hi"[..]));
        q.release(e.slot);
        assert_eq!(q.free(), 2);
    }

    #[test]
    fn dispatch_policies() {
        let w = [Waiting { id: 0, priority: 10 }, Waiting { id: 1, priority: 50 }, Waiting { id: 2, priority: 30 }];
        assert_eq!(choose_receiver(Dispatch::Arbitrary, &w, 99), Some(0));
        assert_eq!(choose_receiver(Dispatch::Priority, &w, 20), Some(2));
        assert_eq!(choose_receiver(Dispatch::Priority, &w, 40), Some(1));
        assert_eq!(choose_receiver(Dispatch::Priority, &w, 60), Some(1));
        assert_eq!(choose_receiver(Dispatch::Priority, &w, 0), Some(0));
        assert_eq!(choose_receiver(Dispatch::Priority, &[], 0), None);
    }

    proptest! {
        /// Priority queues give out messages in non-increasing priority, FIFO among
        /// equals; buffers are never lost.
        #[test]
        fn priority_order_and_no_leak(ops in proptest::collection::vec((0u8..100, any::<bool>()), 1..200)) {
            let mut q = MessageQueue::new(Queueing::PriorityInheritance, 16, 4);
            let mut out: Vec<Entry> = Vec::new();
            for (i, (p, take)) in ops.iter().enumerate() {
                if *take {
                    if let Some(e) = q.pop() { q.release(e.slot); out.push(e); }
                } else {
                    let _ = q.push(i as u64, *p, i as u32, false, &[*p]);
                }
                prop_assert_eq!(q.free() + q.len(), 16);
                if let Some(next) = q.peek() {
                    for e in q.waiting() {
                        prop_assert!(e.priority < next.priority || (e.priority == next.priority && e.arrival >= next.arrival));
                    }
                }
            }
            while let Some(e) = q.pop() { q.release(e.slot); }
            prop_assert_eq!(q.free(), 16);
        }
    }
}
