//! Clients that scribble on their shared memory: each is detected, cut off, told why,
//! and the other clients never notice. The server runs on the test's own thread, so
//! every step happens in a known order.
#![cfg(not(loom))] // the channels need the real atomics; `tests/loom.rs` is the model

mod common;

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use ictus_ipc::Space;
use ictus_shm::layout::{self, CLIENT_FLAG, REP_TAIL, REQ_BELL, REQ_HEAD};
use ictus_shm::record::{encode, encode_pool_ref, Corrupt, Kind};
use ictus_shm::{Client, CloseReason, Event, Next, Server, ServerConfig, WaitConfig};

fn server() -> (Server, OwnedFd) {
    let space = Space::new();
    let server = Server::new(&space, ServerConfig::default()).expect("server");
    let fd = space.send_right_fd(server.service()).expect("send right");
    (server, fd)
}

/// Connect a client while this thread serves the set-up.
fn join(server: &mut Server, service: &OwnedFd, slots: u32) -> Client {
    let fd = rustix::io::fcntl_dupfd_cloexec(service, 0).expect("dup");
    let h = std::thread::spawn(move || connect(&fd, options(geometry(slots))));
    eventually("the client connects", || {
        server.poll_control();
        while server.try_next().is_some() {}
        h.is_finished()
    });
    h.join().expect("client thread")
}

/// Serve everything there is (a record whose reply does not fit waits; it is tried
/// a bounded number of times); return the events.
fn serve(server: &mut Server) -> Vec<Event> {
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..2 {
        let mut budget = 10_000;
        while let Some(n) = server.try_next() {
            echo(n, &tx);
            budget -= 1;
            if budget == 0 {
                break;
            }
        }
        server.poll_control();
    }
    rx.try_iter().collect()
}

/// Tests here count the process's mappings: one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A good client's round trip, served by this thread.
fn good_round_trip(server: &mut Server, c: &mut Client, n: u32) {
    let data = pattern(100, n as u8);
    c.send(n, &data).expect("good client sends");
    for e in serve(server) {
        assert!(!matches!(&e, Event::Closed { .. }), "unexpected {e:?}");
    }
    let r = c.recv(Some(WATCHDOG)).expect("good client's reply");
    assert_eq!((r.tag(), r.to_vec()), (n + 1, data));
}

/// Run one scribble: `attack` does its damage to the evil client (with the server's
/// help where it needs a step in between); the server must cut that client off for
/// `expect`, and the good client must not notice.
fn scenario(slots: u32, expect: fn(&Corrupt) -> bool, attack: impl FnOnce(&mut Server, &mut Client)) {
    let _serial = serial();
    let (mut server, service) = server();
    let mut good = join(&mut server, &service, 0);
    let mut evil = join(&mut server, &service, slots);
    let evil_id = *server.clients().last().expect("two clients");
    let maps = ictus_shm::mappings_named("ictus-shm-channel");
    good_round_trip(&mut server, &mut good, 1);
    attack(&mut server, &mut evil);
    let events = serve(&mut server);
    let closed: Vec<&Event> = events.iter().filter(|e| matches!(e, Event::Closed { .. })).collect();
    match closed.as_slice() {
        [Event::Closed { client, reason: CloseReason::Corrupt(c) }] if *client == evil_id && expect(c) => {}
        other => panic!("expected the evil client cut off, got {other:?}"),
    }
    assert_eq!(server.clients().len(), 1);
    assert_eq!(server.stats().cut_off, 1);
    // The server let go of the evil channel's memory (the client still maps it).
    assert_eq!(ictus_shm::mappings_named("ictus-shm-channel"), maps - 1);
    // The evil client is told why.
    match evil.closed() {
        Some(CloseReason::CutOff(why)) => assert!(!why.is_empty()),
        other => panic!("the evil client should be cut off, is {other:?}"),
    }
    assert!(evil.send(0, b"more").is_err());
    for n in 2..20 {
        good_round_trip(&mut server, &mut good, n);
    }
}

fn ring_at(c: &Client) -> usize {
    c.geometry().request_at() as usize
}

#[test]
fn a_wild_head_is_cut_off() {
    scenario(0, |c| matches!(c, Corrupt::Head { .. }), |_, e| e.scribble(REQ_HEAD, 1 << 40));
}

#[test]
fn a_misaligned_head_is_cut_off() {
    scenario(0, |c| matches!(c, Corrupt::Misaligned(8)), |_, e| e.scribble(REQ_HEAD, 8));
}

#[test]
fn a_head_behind_the_tail_is_cut_off() {
    scenario(
        0,
        |c| matches!(c, Corrupt::Head { .. }),
        |s, e| {
            e.send(0, &[0; 40]).expect("send");
            serve(s);
            e.scribble(REQ_HEAD, 0);
        },
    );
}

#[test]
fn a_length_beyond_the_ring_is_cut_off() {
    scenario(
        0,
        |c| matches!(c, Corrupt::Overrun { .. }),
        |_, e| {
            let [w0, w1] = encode(Kind::Inline, 1 << 20, 0, 0);
            e.scribble(ring_at(e), w0);
            e.scribble(ring_at(e) + 8, w1);
            e.scribble(REQ_HEAD, 32);
        },
    );
}

#[test]
fn a_record_wrapping_past_the_end_is_cut_off() {
    scenario(
        0,
        |c| matches!(c, Corrupt::Overrun { .. }),
        |s, e| {
            let cap = e.geometry().request.cap as usize;
            // Valid records up to 32 bytes before the end of the ring, served.
            let mut head = 0;
            while head + 64 <= cap - 32 {
                e.send(0, &[0; 48]).expect("send");
                head += 64;
                serve(s);
                while e.try_recv().expect("reply").is_some() {}
            }
            while head < cap - 32 {
                e.send(0, &[]).expect("send");
                head += 16;
                serve(s);
                while e.try_recv().expect("reply").is_some() {}
            }
            // Then a record that claims 64 bytes there: it would run past the end.
            let seq = (e.stats().sent) as u32;
            let [w0, w1] = encode(Kind::Inline, 64, 0, seq);
            e.scribble(ring_at(e) + head, w0);
            e.scribble(ring_at(e) + head + 8, w1);
            e.scribble(REQ_HEAD, (head + 96) as u64);
        },
    );
}

#[test]
fn a_pad_that_lies_is_cut_off() {
    scenario(
        0,
        |c| matches!(c, Corrupt::Pad { .. }),
        |_, e| {
            let [w0, w1] = encode(Kind::Pad, 64, 0, 0);
            e.scribble(ring_at(e), w0);
            e.scribble(ring_at(e) + 8, w1);
            e.scribble(REQ_HEAD, 4096);
        },
    );
}

#[test]
fn a_replayed_header_is_cut_off() {
    scenario(
        0,
        |c| matches!(c, Corrupt::Sequence { .. }),
        |s, e| {
            e.send(0, &[7; 16]).expect("send");
            serve(s);
            // Copy the consumed record's header (sequence 0) to the next place.
            let (w0, w1) = (e.peek_word(ring_at(e)), e.peek_word(ring_at(e) + 8));
            e.scribble(ring_at(e) + 32, w0);
            e.scribble(ring_at(e) + 40, w1);
            e.scribble(REQ_HEAD, 64);
        },
    );
}

#[test]
fn a_header_rewritten_after_commit_is_cut_off() {
    scenario(
        0,
        |c| matches!(c, Corrupt::Rewritten { .. }),
        |s, e| {
            e.send(3, &[1; 16]).expect("send");
            let Some(Next::Record(r)) = s.try_next() else { panic!("the record") };
            assert_eq!(r.tag(), 3);
            // While the server holds it, the client changes its length.
            let w0 = e.peek_word(ring_at(e));
            e.scribble(ring_at(e), w0 + 16);
            drop(r);
        },
    );
}

#[test]
fn a_pool_reference_out_of_range_is_cut_off() {
    scenario(
        2,
        |c| matches!(c, Corrupt::PoolRef { .. }),
        |_, e| {
            let [w0, w1] = encode(Kind::Pool, 16, 0, 0);
            e.scribble(ring_at(e), w0);
            e.scribble(ring_at(e) + 8, w1);
            e.scribble(ring_at(e) + 16, encode_pool_ref(99, 10));
            e.scribble(REQ_HEAD, 32);
        },
    );
}

#[test]
fn a_wild_reply_tail_is_cut_off_when_the_server_replies() {
    scenario(
        0,
        |c| matches!(c, Corrupt::Tail { .. }),
        |s, e| {
            // Replies fill the reply ring until the server must read the client's
            // tail to find room: then it finds nonsense.
            for round in 0..2 {
                for _ in 0..20 {
                    e.send(0, &[5; 100]).expect("send");
                }
                if round == 1 {
                    e.scribble(REP_TAIL, 1 << 40);
                }
                if round == 0 {
                    serve(s);
                }
            }
        },
    );
}

#[test]
fn garbage_everywhere_is_cut_off() {
    let _serial = serial();
    let (mut server, service) = server();
    let mut good = join(&mut server, &service, 0);
    let good_id = server.clients()[0];
    for seed in 0..20u64 {
        let evil = join(&mut server, &service, 1);
        let evil_id = *server.clients().iter().find(|&&c| c != good_id).expect("evil");
        let total = evil.geometry().total() as usize;
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for off in (64..total).step_by(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if off != REQ_BELL && off != CLIENT_FLAG {
                evil.scribble(off, x);
            }
        }
        let events = serve(&mut server);
        // Some garbage happens to be an empty ring (head == tail): then nothing is
        // wrong yet. Otherwise the client is cut off.
        for e in &events {
            assert!(matches!(e, Event::Closed { reason: CloseReason::Corrupt(_), .. }), "{e:?}");
        }
        server.close(evil_id);
        serve(&mut server);
        drop(evil);
        good_round_trip(&mut server, &mut good, seed as u32);
    }
    assert_eq!(server.clients().len(), 1);
    let _ = layout::PAGE;
}

/// The paper's footnote: a client that raises and lowers its flags and rings its
/// bell at random cannot keep a sleeping server from serving the others.
#[test]
fn a_client_lying_about_wake_ups_cannot_stall_others() {
    let _serial = serial();
    let wait = WaitConfig { spin: Duration::ZERO, liveness: Duration::from_secs(5) };
    let server = EchoServer::start(ServerConfig { wait, ..ServerConfig::default() });
    let evil = server.client(options(geometry(0)));
    let mut opts = options(geometry(0));
    opts.wait = wait;
    let mut good = server.client(opts);
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let liar = std::thread::spawn(move || {
        let mut x = 1u64;
        while !s.load(Ordering::Relaxed) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            evil.scribble(REQ_BELL, x & 0xffff_ffff);
            evil.scribble(CLIENT_FLAG, x >> 32);
            std::thread::yield_now();
        }
        evil
    });
    for n in 0..100u32 {
        let (tag, back) = round_trip(&mut good, n, &n.to_le_bytes());
        assert_eq!((tag, back), (n + 1, n.to_le_bytes().to_vec()));
    }
    stop.store(true, Ordering::Relaxed);
    liar.join().expect("liar");
}
