//! The clock service's alarm queue (paper 000 §3.1).
//!
//! The paper's clock keeps "an ordered list of alarms", checks it on every clock tick
//! and hands the expired ones to an alarm thread that sends one message each. This is
//! that list, without the ticking: [`AlarmQueue`] holds alarms with a payload of the
//! caller's choosing (for the clock server, the port to notify), answers "when must I
//! next wake?" ([`AlarmQueue::next_deadline`]) and "what is due now?"
//! ([`AlarmQueue::pop_due`]), and never reads a clock itself: `now` is a parameter, so
//! the tests run on a virtual clock.
//!
//! **Ordering.** Alarms are delivered in order of their requested time; alarms
//! requested for the same time are delivered in the order they were set (FIFO).
//!
//! **Resolution.** The paper's alarm granularity is adjustable through the clock-control
//! port. Here an alarm requested for `at` is due at the first resolution tick at or after
//! `at`, ticks being the multiples of the resolution counted from the epoch
//! ([`Time::round_up`]): with a 10 ms resolution an alarm for 13 ms is delivered at
//! 20 ms and one for 20 ms at 20 ms. Alarms are never delivered early. A zero resolution
//! (the default) delivers at exactly `at`. The rounding is applied when the queue is
//! consulted, not when an alarm is set, so changing the resolution re-times every
//! pending alarm; since rounding up preserves order, the delivery order is the same
//! under every resolution.
//!
//! **Bounds.** The queue holds at most `limit` alarms and refuses more with
//! [`InsertError::Full`], handing the payload back, so a client that sets alarms in a
//! loop cannot exhaust the server's memory. (A per-client quota is the server's
//! business; this is the last line.)
//!
//! **Cost.** Alarms live in a `BTreeMap` keyed by `(time, sequence number)` with a
//! second map from [`AlarmId`] to the key: insertion, cancellation and each delivery
//! are O(log n).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::time::Time;

/// How many alarms [`AlarmQueue::default`] holds before it refuses more.
pub const DEFAULT_ALARM_LIMIT: usize = 4096;

/// Names one alarm for cancellation. Never reused by the queue that issued it (a
/// 64-bit sequence number), so a stale or forged id cancels nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AlarmId(u64);

impl AlarmId {
    /// The id as it travels on the wire.
    pub const fn as_raw(self) -> u64 {
        self.0
    }

    /// An id from the wire. Any value is safe to look up; one the queue never issued
    /// (or already delivered or cancelled) simply matches nothing.
    pub const fn from_raw(raw: u64) -> AlarmId {
        AlarmId(raw)
    }
}

impl fmt::Display for AlarmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "alarm #{}", self.0)
    }
}

/// When an alarm should go off, as the paper's clock service accepts it: "either as an
/// absolute time since the last reboot, or as a time measured from when the IPC is
/// received".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// At this instant.
    At(Time),
    /// This long after the request arrived.
    After(Duration),
}

impl When {
    /// The absolute time this names for a request that arrived at `arrival`
    /// (saturating: an interval past the end of time is "never").
    pub fn resolve(self, arrival: Time) -> Time {
        match self {
            When::At(t) => t,
            When::After(d) => arrival.saturating_add(d),
        }
    }
}

/// Why an alarm was not set.
#[derive(thiserror::Error)]
pub enum InsertError<T> {
    /// The queue already holds its limit of alarms. The payload comes back so that the
    /// caller can answer (or release) whatever it stood for.
    #[error("alarm queue is full ({limit} alarms pending)")]
    Full {
        /// The queue's limit.
        limit: usize,
        /// The refused alarm's payload.
        payload: T,
    },
}

impl<T> InsertError<T> {
    /// The payload of the refused alarm.
    pub fn into_payload(self) -> T {
        match self {
            InsertError::Full { payload, .. } => payload,
        }
    }
}

impl<T> fmt::Debug for InsertError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InsertError::Full { limit, .. } => f.debug_struct("Full").field("limit", limit).finish_non_exhaustive(),
        }
    }
}

/// A bounded queue of alarms ordered by time, with cancellation. See the module
/// documentation for ordering, resolution and bounds.
pub struct AlarmQueue<T> {
    /// Pending alarms by `(requested time, sequence number)`.
    by_time: BTreeMap<(Time, u64), T>,
    /// Requested time of each pending alarm, by sequence number (= [`AlarmId`]).
    by_id: BTreeMap<u64, Time>,
    next_seq: u64,
    resolution: Duration,
    limit: usize,
}

impl<T> fmt::Debug for AlarmQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlarmQueue")
            .field("pending", &self.by_time.len())
            .field("limit", &self.limit)
            .field("resolution", &self.resolution)
            .field("next_deadline", &self.next_deadline())
            .finish()
    }
}

impl<T> Default for AlarmQueue<T> {
    fn default() -> Self {
        AlarmQueue::new(DEFAULT_ALARM_LIMIT)
    }
}

impl<T> AlarmQueue<T> {
    /// An empty queue that holds at most `limit` alarms, with exact (zero) resolution.
    pub fn new(limit: usize) -> AlarmQueue<T> {
        AlarmQueue { by_time: BTreeMap::new(), by_id: BTreeMap::new(), next_seq: 0, resolution: Duration::ZERO, limit }
    }

    /// Set an alarm for the absolute time `at`.
    pub fn insert(&mut self, at: Time, payload: T) -> Result<AlarmId, InsertError<T>> {
        if self.by_time.len() >= self.limit {
            return Err(InsertError::Full { limit: self.limit, payload });
        }
        let seq = self.next_seq;
        // 2⁶⁴ alarms will not be set in this process's lifetime; wrapping (rather than
        // panicking) only matters in theory.
        self.next_seq = self.next_seq.wrapping_add(1);
        self.by_time.insert((at, seq), payload);
        self.by_id.insert(seq, at);
        Ok(AlarmId(seq))
    }

    /// Set an alarm for `delay` after `arrival` (the time the request was received).
    pub fn insert_after(&mut self, arrival: Time, delay: Duration, payload: T) -> Result<AlarmId, InsertError<T>> {
        self.insert(arrival.saturating_add(delay), payload)
    }

    /// Set an alarm as a clock-service request names it: absolute, or relative to
    /// `arrival`.
    pub fn insert_when(&mut self, when: When, arrival: Time, payload: T) -> Result<AlarmId, InsertError<T>> {
        self.insert(when.resolve(arrival), payload)
    }

    /// Cancel a pending alarm, returning its payload; `None` if `id` is not pending
    /// (already delivered, already cancelled, or never issued).
    pub fn cancel(&mut self, id: AlarmId) -> Option<T> {
        let at = self.by_id.remove(&id.0)?;
        self.by_time.remove(&(at, id.0))
    }

    /// The requested time and payload of a pending alarm.
    pub fn get(&self, id: AlarmId) -> Option<(Time, &T)> {
        let at = *self.by_id.get(&id.0)?;
        self.by_time.get(&(at, id.0)).map(|p| (at, p))
    }

    /// When a pending alarm will be delivered under the current resolution.
    pub fn delivery_time(&self, id: AlarmId) -> Option<Time> {
        self.by_id.get(&id.0).map(|at| at.round_up(self.resolution))
    }

    /// The earliest time at which [`AlarmQueue::pop_due`] will return something, under
    /// the current resolution; `None` if no alarm is pending. The clock's shell sleeps
    /// until then (or until a request changes the answer).
    pub fn next_deadline(&self) -> Option<Time> {
        self.by_time.keys().next().map(|(at, _)| at.round_up(self.resolution))
    }

    /// Remove and return every alarm due at `now` (its resolution tick is at or before
    /// `now`), in order of requested time, ties in the order they were set.
    pub fn pop_due(&mut self, now: Time) -> Vec<(AlarmId, T)> {
        let mut due = Vec::new();
        while let Some(entry) = self.by_time.first_entry() {
            let (at, seq) = *entry.key();
            if at.round_up(self.resolution) > now {
                break;
            }
            let payload = entry.remove();
            self.by_id.remove(&seq);
            due.push((AlarmId(seq), payload));
        }
        due
    }

    /// Remove and return (in delivery order) every pending alarm whose payload matches
    /// `pred` — for the clock server, the alarms whose reply port has died. O(n).
    pub fn remove_if(&mut self, mut pred: impl FnMut(&T) -> bool) -> Vec<(AlarmId, T)> {
        let doomed: Vec<(Time, u64)> = self.by_time.iter().filter(|(_, p)| pred(p)).map(|(k, _)| *k).collect();
        doomed
            .into_iter()
            .filter_map(|key| {
                self.by_id.remove(&key.1);
                self.by_time.remove(&key).map(|p| (AlarmId(key.1), p))
            })
            .collect()
    }

    /// Set the alarm resolution (the clock-control port's privilege). Zero is exact.
    /// Applies to pending alarms too; see the module documentation.
    pub fn set_resolution(&mut self, resolution: Duration) {
        self.resolution = resolution;
    }

    /// The alarm resolution.
    pub fn resolution(&self) -> Duration {
        self.resolution
    }

    /// Pending alarms.
    pub fn len(&self) -> usize {
        self.by_time.len()
    }

    /// No alarm is pending.
    pub fn is_empty(&self) -> bool {
        self.by_time.is_empty()
    }

    /// How many alarms the queue holds before refusing more.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Pending alarms in delivery order: id, requested time, payload.
    pub fn iter(&self) -> impl Iterator<Item = (AlarmId, Time, &T)> + '_ {
        self.by_time.iter().map(|((at, seq), p)| (AlarmId(*seq), *at, p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Time {
        Time::from_millis(n)
    }

    #[test]
    fn delivers_in_time_order_ties_fifo() {
        let mut q = AlarmQueue::new(16);
        let c = q.insert(ms(30), "c").unwrap();
        let a1 = q.insert(ms(10), "a1").unwrap();
        let b = q.insert(ms(20), "b").unwrap();
        let a2 = q.insert(ms(10), "a2").unwrap();
        assert_eq!(q.len(), 4);
        assert_eq!(q.next_deadline(), Some(ms(10)));
        assert!(q.pop_due(ms(9)).is_empty());
        assert_eq!(q.pop_due(ms(10)), vec![(a1, "a1"), (a2, "a2")]);
        assert_eq!(q.next_deadline(), Some(ms(20)));
        // A late wake-up delivers everything overdue, still in order.
        assert_eq!(q.pop_due(ms(100)), vec![(b, "b"), (c, "c")]);
        assert!(q.is_empty());
        assert_eq!(q.next_deadline(), None);
    }

    #[test]
    fn cancel_removes_exactly_one_and_ids_are_not_reused() {
        let mut q = AlarmQueue::new(16);
        let a = q.insert(ms(10), 1).unwrap();
        let b = q.insert(ms(10), 2).unwrap();
        assert_eq!(q.get(a), Some((ms(10), &1)));
        assert_eq!(q.cancel(a), Some(1));
        assert_eq!(q.cancel(a), None, "a second cancel finds nothing");
        assert_eq!(q.cancel(AlarmId::from_raw(999)), None, "a forged id finds nothing");
        assert_eq!(q.pop_due(ms(10)), vec![(b, 2)]);
        assert_eq!(q.cancel(b), None, "a delivered alarm cannot be cancelled");
        let c = q.insert(ms(10), 3).unwrap();
        assert!(c != a && c != b);
        assert_eq!(AlarmId::from_raw(c.as_raw()), c);
    }

    #[test]
    fn resolution_rounds_up_to_the_next_tick() {
        let mut q = AlarmQueue::new(16);
        q.set_resolution(Duration::from_millis(10));
        assert_eq!(q.resolution(), Duration::from_millis(10));
        let a = q.insert(ms(13), "a").unwrap();
        let b = q.insert(ms(20), "b").unwrap();
        let c = q.insert(ms(21), "c").unwrap();
        assert_eq!(q.delivery_time(a), Some(ms(20)));
        assert_eq!(q.next_deadline(), Some(ms(20)));
        assert!(q.pop_due(ms(19)).is_empty(), "never early, even if the requested time has passed");
        assert_eq!(q.pop_due(ms(20)), vec![(a, "a"), (b, "b")]);
        assert_eq!(q.next_deadline(), Some(ms(30)));
        // Back to exact: the remaining alarm is due at its own time again.
        q.set_resolution(Duration::ZERO);
        assert_eq!(q.next_deadline(), Some(ms(21)));
        assert_eq!(q.pop_due(ms(21)), vec![(c, "c")]);
    }

    #[test]
    fn relative_alarms_count_from_arrival() {
        let mut q = AlarmQueue::new(16);
        let a = q.insert_after(ms(100), Duration::from_millis(5), "a").unwrap();
        let b = q.insert_when(When::After(Duration::from_millis(1)), ms(103), "b").unwrap();
        let c = q.insert_when(When::At(ms(104)), ms(0), "c").unwrap();
        let never = q.insert_after(ms(1), Duration::MAX, "never").unwrap();
        assert_eq!(q.get(a).map(|(t, _)| t), Some(ms(105)));
        assert_eq!(q.get(never).map(|(t, _)| t), Some(Time::MAX));
        assert_eq!(q.pop_due(ms(105)), vec![(b, "b"), (c, "c"), (a, "a")]);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn bounded_and_gives_the_payload_back() {
        let mut q = AlarmQueue::new(2);
        assert_eq!(q.limit(), 2);
        let a = q.insert(ms(1), String::from("a")).unwrap();
        q.insert(ms(2), String::from("b")).unwrap();
        let err = q.insert(ms(3), String::from("c")).unwrap_err();
        assert_eq!(err.to_string(), "alarm queue is full (2 alarms pending)");
        assert!(matches!(&err, InsertError::Full { limit: 2, .. }));
        assert_eq!(err.into_payload(), "c");
        // Room again after a cancellation.
        q.cancel(a);
        assert!(q.insert(ms(3), String::from("c")).is_ok());
        assert_eq!(AlarmQueue::<()>::default().limit(), DEFAULT_ALARM_LIMIT);
    }

    #[test]
    fn remove_if_drops_alarms_of_a_dead_port() {
        let mut q = AlarmQueue::new(16);
        let a = q.insert(ms(3), ("port1", 1)).unwrap();
        let b = q.insert(ms(1), ("port2", 2)).unwrap();
        let c = q.insert(ms(2), ("port1", 3)).unwrap();
        let removed = q.remove_if(|(port, _)| *port == "port1");
        assert_eq!(removed, vec![(c, ("port1", 3)), (a, ("port1", 1))]);
        assert_eq!(q.cancel(a), None);
        assert_eq!(q.iter().map(|(id, t, _)| (id, t)).collect::<Vec<_>>(), vec![(b, ms(1))]);
        assert!(format!("{q:?}").contains("pending: 1"));
    }

    /// One step of the model test.
    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64),
        Cancel(usize),
        Advance(u64),
        Resolution(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..200).prop_map(Op::Insert),
            2 => any::<usize>().prop_map(Op::Cancel),
            2 => (0u64..40).prop_map(Op::Advance),
            1 => prop_oneof![Just(0u64), 1u64..25].prop_map(Op::Resolution),
        ]
    }

    proptest! {
        #![proptest_config(crate::proptest_config())]

        /// The queue agrees with a naive model (a list scanned in full every time)
        /// on every delivery, cancellation, refusal and next deadline.
        #[test]
        fn agrees_with_a_naive_model(ops in proptest::collection::vec(op(), 1..200), limit in 1usize..20) {
            let mut q = AlarmQueue::new(limit);
            // (id, requested time, payload) in insertion order.
            let mut model: Vec<(AlarmId, Time, u32)> = Vec::new();
            let mut issued: Vec<AlarmId> = Vec::new();
            let mut res = Duration::ZERO;
            let mut now = Time::ZERO;
            let mut next_payload = 0u32;
            for op in ops {
                let advanced = matches!(op, Op::Advance(_));
                match op {
                    Op::Insert(at) => {
                        let at = Time::from_nanos(at);
                        let payload = next_payload;
                        next_payload += 1;
                        match q.insert(at, payload) {
                            Ok(id) => {
                                prop_assert!(model.len() < limit);
                                prop_assert!(!issued.contains(&id));
                                issued.push(id);
                                model.push((id, at, payload));
                            }
                            Err(e) => {
                                prop_assert_eq!(model.len(), limit);
                                prop_assert_eq!(e.into_payload(), payload);
                            }
                        }
                    }
                    Op::Cancel(i) => {
                        if issued.is_empty() {
                            continue;
                        }
                        let id = issued[i % issued.len()];
                        let expect = model.iter().position(|(m, _, _)| *m == id).map(|i| model.remove(i).2);
                        prop_assert_eq!(q.cancel(id), expect);
                    }
                    Op::Advance(by) => {
                        now += Duration::from_nanos(by);
                        let mut expect: Vec<(AlarmId, Time, u32)> =
                            model.iter().filter(|(_, at, _)| at.round_up(res) <= now).cloned().collect();
                        // Stable sort: equal times keep insertion order.
                        expect.sort_by_key(|(_, at, _)| *at);
                        model.retain(|(_, at, _)| at.round_up(res) > now);
                        let got = q.pop_due(now);
                        let expect: Vec<(AlarmId, u32)> = expect.into_iter().map(|(id, _, p)| (id, p)).collect();
                        prop_assert_eq!(got, expect);
                    }
                    Op::Resolution(r) => {
                        res = Duration::from_nanos(r);
                        q.set_resolution(res);
                    }
                }
                prop_assert_eq!(q.len(), model.len());
                let expect_next = model.iter().map(|(_, at, _)| at.round_up(res)).min();
                prop_assert_eq!(q.next_deadline(), expect_next);
                if let (true, Some(next)) = (advanced, expect_next) {
                    prop_assert!(next > now, "nothing overdue is left behind");
                }
            }
        }
    }
}
