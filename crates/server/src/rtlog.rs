//! Logging from real-time paths: a preallocated ring of fixed-size events, written
//! without allocating, locking or entering the kernel, and drained into the logs by a
//! thread of its own.
//!
//! A real-time thread (the clock server's alarm path, the MIDI driver thread) must not
//! format a line or write to a file: either can take milliseconds (a page fault, a full
//! pipe to the journal), which is the lateness the thread exists to avoid. Instead it
//! [`RtWriter::record`]s an event — one of a fixed table of [`RtEvent`]s, a time and
//! three numbers — into a single-producer ring made up front; if the ring is full the
//! event is counted, never waited for. A drainer thread ([`RtLog::spawn_drainer`],
//! timesharing) wakes every [`DRAIN_PERIOD`], turns each event into a `tracing` event
//! with its fields, and says how many were lost.
//!
//! The ring is plain atomics (no `unsafe`): each slot is four words, the writer stores
//! them then publishes the head with Release, the drainer reads the head with Acquire,
//! then the slots, then gives them back by storing the tail with Release.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::Level;

/// How often the drainer looks at the ring.
pub const DRAIN_PERIOD: Duration = Duration::from_millis(50);

/// One kind of event a real-time path may record: its level, its name (the `event`
/// field), and its message, whose `{}`s are filled with the record's numbers in order.
#[derive(Debug)]
pub struct RtEvent {
    /// The level it is logged at.
    pub level: Level,
    /// A short name, logged as the `event` field.
    pub name: &'static str,
    /// The message; up to three `{}` take the record's numbers.
    pub message: &'static str,
    /// The names of the three numbers, logged as fields (`""`: unused).
    pub fields: [&'static str; 3],
}

/// A slot: the event's index in the table, its time, three numbers.
#[derive(Debug, Default)]
struct Slot {
    event: AtomicU64,
    at_ns: AtomicU64,
    args: [AtomicU64; 3],
}

#[derive(Debug)]
struct Ring {
    slots: Box<[Slot]>,
    /// Events written (the writer's).
    head: AtomicU64,
    /// Events drained (the drainer's).
    tail: AtomicU64,
    /// Events lost because the ring was full.
    lost: AtomicU64,
    /// The writer is gone: drain what is left, then stop.
    closed: AtomicBool,
    events: &'static [RtEvent],
}

/// A log for one real-time path: its writer and its reader, made together.
#[derive(Debug)]
pub struct RtLog;

/// The writing end: owned by the one real-time thread that records (not `Clone`).
#[derive(Debug)]
pub struct RtWriter {
    ring: Arc<Ring>,
    head: u64,
}

/// The reading end, for the drainer.
#[derive(Debug)]
pub struct RtReader {
    ring: Arc<Ring>,
}

/// One drained event, as the drainer logs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drained {
    /// Which event of the table.
    pub event: usize,
    /// When it was recorded (the writer's clock, nanoseconds).
    pub at_ns: u64,
    /// Its numbers.
    pub args: [u64; 3],
}

impl RtLog {
    /// A ring of `capacity` events (rounded up to a power of two, at least 16) for the
    /// events of `table`. All its memory is allocated here.
    pub fn channel(table: &'static [RtEvent], capacity: usize) -> (RtWriter, RtReader) {
        let cap = capacity.max(16).next_power_of_two();
        let ring = Arc::new(Ring {
            slots: (0..cap).map(|_| Slot::default()).collect(),
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            events: table,
        });
        (RtWriter { ring: ring.clone(), head: 0 }, RtReader { ring })
    }

    /// A thread (timesharing, named `rtlog-SERVER`) that drains `reader` into the logs
    /// every [`DRAIN_PERIOD`] as `server`'s events, until the writer is dropped and the
    /// ring is empty.
    pub fn spawn_drainer(reader: RtReader, server: &'static str) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new().name(format!("rtlog-{server}")).spawn(move || {
            let mut lost = 0;
            loop {
                let closed = reader.ring.closed.load(Ordering::Acquire);
                reader.drain(|d| emit(server, &reader.ring.events[d.event], &d));
                let now_lost = reader.lost();
                if now_lost > lost {
                    tracing::warn!(
                        server,
                        lost = now_lost - lost,
                        "a real-time path's log ring was full: {} events were not logged",
                        now_lost - lost
                    );
                    lost = now_lost;
                }
                if closed {
                    return;
                }
                std::thread::park_timeout(DRAIN_PERIOD);
            }
        })
    }
}

impl RtWriter {
    /// Record `event` (an index into the table) at `at_ns` with `args`: four stores and
    /// one Release, or a count if the ring is full. Never blocks, allocates or calls the
    /// kernel.
    #[inline]
    pub fn record(&mut self, event: usize, at_ns: u64, args: [u64; 3]) {
        let r = &*self.ring;
        // SYNC POINT: Acquire on `tail` pairs with the drainer's Release: the slots
        // before it are read and may be overwritten.
        let tail = r.tail.load(Ordering::Acquire);
        if self.head.wrapping_sub(tail) >= r.slots.len() as u64 || event >= r.events.len() {
            r.lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let slot = &r.slots[(self.head as usize) & (r.slots.len() - 1)];
        slot.event.store(event as u64, Ordering::Relaxed);
        slot.at_ns.store(at_ns, Ordering::Relaxed);
        for (a, v) in slot.args.iter().zip(args) {
            a.store(v, Ordering::Relaxed);
        }
        self.head = self.head.wrapping_add(1);
        // SYNC POINT: Release on `head` publishes the slot to the drainer's Acquire.
        r.head.store(self.head, Ordering::Release);
    }
}

impl Drop for RtWriter {
    fn drop(&mut self) {
        self.ring.closed.store(true, Ordering::Release);
    }
}

impl RtReader {
    /// Hand every event recorded so far to `f`, oldest first, and free their slots.
    pub fn drain(&self, mut f: impl FnMut(Drained)) -> usize {
        let r = &*self.ring;
        let mut tail = r.tail.load(Ordering::Relaxed);
        // SYNC POINT: Acquire on `head` pairs with the writer's Release.
        let head = r.head.load(Ordering::Acquire);
        let mut n = 0;
        while tail != head {
            let slot = &r.slots[(tail as usize) & (r.slots.len() - 1)];
            let d = Drained {
                event: slot.event.load(Ordering::Relaxed) as usize,
                at_ns: slot.at_ns.load(Ordering::Relaxed),
                args: [0, 1, 2].map(|i| slot.args[i].load(Ordering::Relaxed)),
            };
            tail = tail.wrapping_add(1);
            // SYNC POINT: Release on `tail`: the slot is read; the writer may reuse it.
            r.tail.store(tail, Ordering::Release);
            f(d);
            n += 1;
        }
        n
    }

    /// Events lost so far because the ring was full.
    pub fn lost(&self) -> u64 {
        self.ring.lost.load(Ordering::Relaxed)
    }
}

/// The message with its `{}`s filled in order.
pub fn render(message: &str, args: [u64; 3]) -> String {
    let mut out = String::with_capacity(message.len() + 16);
    let mut args = args.iter();
    let mut rest = message;
    while let Some(i) = rest.find("{}") {
        out.push_str(&rest[..i]);
        match args.next() {
            Some(v) => out.push_str(&v.to_string()),
            None => out.push_str("{}"),
        }
        rest = &rest[i + 2..];
    }
    out.push_str(rest);
    out
}

fn emit(server: &'static str, e: &RtEvent, d: &Drained) {
    let text = render(e.message, d.args);
    let [f0, f1, f2] = e.fields;
    let [a0, a1, a2] = d.args;
    // Field names are the table's; `tracing` wants them static at the call site, so
    // the three numbers travel as `a0..a2` beside their names.
    macro_rules! at {
        ($lvl:expr) => {
            tracing::event!(
                $lvl,
                server,
                event = e.name,
                at_ns = d.at_ns,
                realtime = true,
                a0_name = f0,
                a0 = a0,
                a1_name = f1,
                a1 = a1,
                a2_name = f2,
                a2 = a2,
                "{text}"
            )
        };
    }
    match e.level {
        Level::ERROR => at!(Level::ERROR),
        Level::WARN => at!(Level::WARN),
        Level::INFO => at!(Level::INFO),
        Level::DEBUG => at!(Level::DEBUG),
        _ => at!(Level::TRACE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static EVENTS: &[RtEvent] = &[
        RtEvent {
            level: Level::WARN,
            name: "late",
            message: "alarm {} sent {} µs late",
            fields: ["alarm", "late_us", ""],
        },
        RtEvent { level: Level::INFO, name: "x", message: "no numbers", fields: ["", "", ""] },
    ];

    #[test]
    fn events_come_out_in_order_and_a_full_ring_counts_what_it_loses() {
        let (mut w, r) = RtLog::channel(EVENTS, 16);
        for i in 0..20u64 {
            w.record((i % 2) as usize, i, [i, i * 10, 0]);
        }
        assert_eq!(r.lost(), 4, "16 fit, 4 were lost");
        let mut got = Vec::new();
        assert_eq!(r.drain(|d| got.push(d)), 16);
        assert_eq!(got[0], Drained { event: 0, at_ns: 0, args: [0, 0, 0] });
        assert_eq!(got[15], Drained { event: 1, at_ns: 15, args: [15, 150, 0] });
        // Room again once drained.
        w.record(0, 99, [7, 8, 9]);
        assert_eq!(r.drain(|_| {}), 1);
        w.record(5, 0, [0; 3]);
        assert_eq!(r.lost(), 5, "an event outside the table is lost, not trusted");
    }

    #[test]
    fn messages_are_rendered_with_their_numbers() {
        assert_eq!(render(EVENTS[0].message, [3, 1200, 0]), "alarm 3 sent 1200 µs late");
        assert_eq!(render("{} {} {} {}", [1, 2, 3]), "1 2 3 {}");
    }

    #[test]
    fn a_writer_on_another_thread_loses_nothing_the_ring_can_hold() {
        let (mut w, r) = RtLog::channel(EVENTS, 64);
        let t = std::thread::spawn(move || {
            for i in 0..10_000u64 {
                // Never waits: a full ring counts instead.
                w.record(0, i, [i, 0, 0]);
            }
        });
        let mut seen = Vec::new();
        loop {
            let done = t.is_finished();
            if r.drain(|d| seen.push(d.args[0])) == 0 && done {
                break;
            }
        }
        t.join().unwrap();
        r.drain(|d| seen.push(d.args[0]));
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order, none twice");
        assert_eq!(seen.len() as u64 + r.lost(), 10_000, "every event drained or counted");
    }

    #[test]
    fn the_drainer_stops_when_the_writer_goes() {
        let (mut w, r) = RtLog::channel(EVENTS, 16);
        let h = RtLog::spawn_drainer(r, "test-server").unwrap();
        w.record(0, 1, [1, 2, 0]);
        drop(w);
        h.join().unwrap();
    }
}
