//! A model check of the ring protocol and the wake-up protocol, on the crate's own
//! code: `Producer`, `Consumer`, `Sleeper`, `Waker`, `ring`, in both directions of
//! waiting: a consumer asleep for records, a producer asleep for room.
//!
//! Under loom (`RUSTFLAGS="--cfg loom" cargo test -p ictus-shm --release --test loom`)
//! every interleaving (up to a preemption bound) and loom's weak-memory behaviours are
//! explored: a missing Release/Acquire shows as a stale payload, a lost wake-up as a
//! deadlock. In the normal test run the same scenarios run on real threads many times
//! (a stress run, not exhaustive); the exhaustive sequentially-consistent model of the
//! wake-up protocol is the unit test `wake::tests::no_interleaving_loses_a_wake_up`.

#[cfg(loom)]
use loom::{
    sync::atomic::{fence, AtomicU32, AtomicU64, Ordering},
    sync::{Arc, Condvar, Mutex},
    thread,
};
#[cfg(not(loom))]
use std::{
    sync::atomic::{fence, AtomicU32, AtomicU64, Ordering},
    sync::{Arc, Condvar, Mutex},
    thread,
};

use ictus_shm::record::{Kind, RingGeometry, MIN_RING};
use ictus_shm::ring::{Consumer, Producer, ReserveError, RingMem};
use ictus_shm::wake::{self, Sleeper, WakeBy, Waker};

struct Mem {
    head: AtomicU64,
    tail: AtomicU64,
    words: Vec<AtomicU64>,
    /// The consumer's "asleep" flag and the producer's doorbell.
    flag: AtomicU32,
    bell: AtomicU32,
    futex: Futex,
}

#[derive(Clone)]
struct M(Arc<Mem>);

impl RingMem for M {
    fn head(&self) -> &AtomicU64 {
        &self.0.head
    }
    fn tail(&self) -> &AtomicU64 {
        &self.0.tail
    }
    fn word(&self, i: usize) -> &AtomicU64 {
        &self.0.words[i]
    }
}

/// A futex: the value is compared under the lock the waker takes to wake, as the
/// kernel compares under its hash-bucket lock.
struct Futex {
    lock: Mutex<()>,
    cv: Condvar,
}

impl Futex {
    fn wait(&self, word: &AtomicU32, expected: u32) {
        let g = self.lock.lock().unwrap();
        // A read-modify-write reads the latest value, as the kernel's compare does.
        if word.fetch_add(0, Ordering::SeqCst) == expected {
            drop(self.cv.wait(g).unwrap());
        }
    }
    fn wake(&self) {
        let _g = self.lock.lock().unwrap();
        self.cv.notify_all();
    }
}

fn mem() -> M {
    M(Arc::new(Mem {
        head: AtomicU64::new(0),
        tail: AtomicU64::new(0),
        words: (0..MIN_RING / 8).map(|_| AtomicU64::new(0)).collect(),
        flag: AtomicU32::new(0),
        bell: AtomicU32::new(0),
        futex: Futex { lock: Mutex::new(()), cv: Condvar::new() },
    }))
}

#[cfg(loom)]
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

#[cfg(not(loom))]
fn model(f: impl Fn() + Sync + Send + 'static) {
    for _ in 0..300 {
        f();
    }
}

/// Payload sizes: the third must wait for room and wraps behind a pad.
const LENS: [u32; 3] = [40, 100, 100];

/// The producer writes records whose first payload word is their number; the consumer
/// must see each record's header and payload exactly, in order, across the wrap.
#[test]
fn records_cross_intact_and_wrap() {
    model(|| {
        let ring = RingGeometry::new(MIN_RING).unwrap();
        let m = mem();
        let pm = m.clone();
        let producer = thread::spawn(move || {
            let mut p = Producer::new(pm, ring);
            for (i, &len) in LENS.iter().enumerate() {
                let r = loop {
                    match p.reserve(len) {
                        Ok(r) => break r,
                        Err(ReserveError::Full) => thread::yield_now(),
                        Err(e) => panic!("{e}"),
                    }
                };
                p.write_payload_word(&r, 0, i as u64 + 1);
                p.commit(r, Kind::Inline, i as u32);
            }
        });
        let mut c = Consumer::new(m, ring);
        let mut got = 0;
        while got < LENS.len() {
            match c.peek().expect("a valid ring") {
                Some(rec) => {
                    assert_eq!((rec.frame.tag, rec.frame.len), (got as u32, LENS[got]));
                    assert_eq!(c.payload_word(&rec, 0), got as u64 + 1, "stale payload");
                    c.release(rec, true).expect("unchanged");
                    got += 1;
                }
                None => thread::yield_now(),
            }
        }
        producer.join().unwrap();
    });
}

/// The consumer sleeps with the protocol whenever the ring is empty; the producer
/// wakes it only when the flag says so, once per sleep. A lost wake-up is a deadlock.
#[test]
fn no_wake_up_is_lost() {
    model(|| {
        let ring = RingGeometry::new(MIN_RING).unwrap();
        let m = mem();
        let pm = m.clone();
        let producer = thread::spawn(move || {
            let mut p = Producer::new(pm.clone(), ring);
            let mut waker = Waker::new();
            for i in 0..3u32 {
                let r = p.reserve(8).unwrap();
                p.write_payload_word(&r, 0, u64::from(i) + 1);
                p.commit(r, Kind::Inline, i);
                if let Some(how) = waker.check(&pm.0.flag) {
                    assert_eq!(how, WakeBy::Futex);
                    wake::ring(&pm.0.bell);
                    pm.0.futex.wake();
                }
            }
        });
        let mut c = Consumer::new(m.clone(), ring);
        let mut sleeper = Sleeper::new();
        let mut got = 0;
        while got < 3 {
            if let Some(rec) = c.peek().expect("a valid ring") {
                assert_eq!(c.payload_word(&rec, 0), got as u64 + 1);
                c.release(rec, false).unwrap();
                got += 1;
                continue;
            }
            // The protocol's order: the bell, then the flag, then the ring again.
            let seen = wake::read_bell(&m.0.bell);
            sleeper.announce(&m.0.flag, false);
            if !c.ready() {
                m.0.futex.wait(&m.0.bell, seen);
            }
            sleeper.end(&m.0.flag);
        }
        producer.join().unwrap();
    });
}

/// The other direction of waiting: the producer fills the ring and sleeps *for
/// room* (its flag says so, [`wake::ROOM`]); the consumer, after each record it takes,
/// wakes it only through [`Waker::check_room`], once per sleep. A lost room wake-up is
/// a deadlock (the producer waits on an unchanged bell with room it never saw).
#[test]
fn no_room_wake_up_is_lost() {
    model(|| {
        let ring = RingGeometry::new(MIN_RING).unwrap();
        let m = mem();
        let pm = m.clone();
        let producer = thread::spawn(move || {
            let mut p = Producer::new(pm.clone(), ring);
            let mut sleeper = Sleeper::new();
            for (i, &len) in LENS.iter().enumerate() {
                let r = loop {
                    match p.reserve(len) {
                        Ok(r) => break r,
                        Err(ReserveError::Full) => {}
                        Err(e) => panic!("{e}"),
                    }
                    // The protocol's order, waiting for room: the bell, then the flag
                    // (with the room bit), then the room again.
                    let seen = wake::read_bell(&pm.0.bell);
                    sleeper.announce_for(&pm.0.flag, false, true);
                    if !p.has_room(len).expect("a valid tail") {
                        pm.0.futex.wait(&pm.0.bell, seen);
                    }
                    sleeper.end(&pm.0.flag);
                };
                p.write_payload_word(&r, 0, i as u64 + 1);
                p.commit(r, Kind::Inline, i as u32);
            }
        });
        let mut c = Consumer::new(m.clone(), ring);
        let mut waker = Waker::new();
        let mut got = 0;
        while got < LENS.len() {
            match c.peek().expect("a valid ring") {
                Some(rec) => {
                    assert_eq!(c.payload_word(&rec, 0), got as u64 + 1, "stale payload");
                    c.release(rec, true).expect("unchanged");
                    got += 1;
                    // Room made: wake the producer only if it sleeps for room.
                    if let Some(how) = waker.check_room(&m.0.flag) {
                        assert_eq!(how, WakeBy::Futex);
                        wake::ring(&m.0.bell);
                        m.0.futex.wake();
                    }
                }
                None => thread::yield_now(),
            }
        }
        producer.join().unwrap();
    });
}

/// A sleep for records is not ended by room: the consumer's room wake-ups go
/// nowhere while the producer of the *other* ring sleeps for a record, which
/// arrives with its own wake-up ([`Waker::check`]). On real threads and under loom:
/// the sleeper is woken exactly by the record (no deadlock, no stale read), and the
/// room check never rings the bell.
#[test]
fn room_does_not_wake_a_sleep_for_records() {
    model(|| {
        let m = mem();
        let wm = m.clone();
        let waker = thread::spawn(move || {
            let mut w = Waker::new();
            // Room first: the sleeper does not wait for room, so nothing rings.
            let before = wm.0.bell.load(Ordering::SeqCst);
            assert_eq!(w.check_room(&wm.0.flag), None);
            assert_eq!(wm.0.bell.load(Ordering::SeqCst), before);
            // Then the record, published, then checked.
            wm.0.head.store(1, Ordering::Release);
            if w.check(&wm.0.flag).is_some() {
                wake::ring(&wm.0.bell);
                wm.0.futex.wake();
            }
        });
        let mut sleeper = Sleeper::new();
        loop {
            if m.0.head.load(Ordering::Acquire) == 1 {
                break;
            }
            let seen = wake::read_bell(&m.0.bell);
            sleeper.announce(&m.0.flag, false);
            if m.0.head.load(Ordering::Acquire) != 1 {
                m.0.futex.wait(&m.0.bell, seen);
            }
            sleeper.end(&m.0.flag);
        }
        waker.join().unwrap();
    });
}

/// The store-buffer litmus test with SeqCst fences, which the wake-up protocol rests
/// on: both loads cannot miss both stores.
#[test]
fn store_buffering_with_fences() {
    model(|| {
        let x = Arc::new(AtomicU64::new(0));
        let y = Arc::new(AtomicU64::new(0));
        let (x2, y2) = (x.clone(), y.clone());
        let t = thread::spawn(move || {
            y2.store(1, Ordering::Release);
            fence(Ordering::SeqCst);
            x2.load(Ordering::Relaxed)
        });
        x.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let r1 = y.load(Ordering::Relaxed);
        let r2 = t.join().unwrap();
        assert!(r1 == 1 || r2 == 1, "both missed");
    });
}
