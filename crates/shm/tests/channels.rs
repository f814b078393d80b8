//! Channels within one process: set-up over a port, round trips, loans, wrap-around,
//! the pollable descriptors, and clean teardown.
#![cfg(not(loom))] // the channels need the real atomics; `tests/loom.rs` is the model

mod common;

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use common::*;
use ictus_shm::{CloseReason, Event, RecvError, SendError, ServerConfig, SleepMode, WaitConfig};
use rustix::event::{poll, PollFd, PollFlags, Timespec};

#[test]
fn records_of_every_size_go_round_and_wrap() {
    let server = EchoServer::start(ServerConfig::default());
    let mut c = server.client(options(geometry(0)));
    let Event::Opened { client, credentials, .. } = server.event() else { panic!("not an open") };
    assert_eq!(credentials.pid, std::process::id());
    let max = c.geometry().request.max_payload() as usize;
    for n in 0..400usize {
        let len = (n * 37) % (max + 1);
        let data = pattern(len, n as u8);
        let (tag, back) = round_trip(&mut c, n as u32, &data);
        assert_eq!(tag, n as u32 + 1);
        assert_eq!(back, data, "record {n} of {len} bytes");
    }
    assert!(matches!(c.send(0, &vec![0; max + 1]), Err(SendError::TooLarge { .. })));
    drop(c);
    assert_eq!(server.event(), Event::Closed { client, reason: CloseReason::PeerGone });
}

#[test]
fn loans_write_in_place_and_pool_buffers_come_back() {
    let server = EchoServer::start(ServerConfig::default());
    let mut c = server.client(options(geometry(3)));
    // In the ring: written in place, truncated, committed.
    let mut loan = c.loan(100).expect("loan");
    loan[..5].copy_from_slice(b"hello");
    loan.truncate(5);
    loan.commit(7);
    let r = c.recv(Some(WATCHDOG)).expect("reply");
    assert_eq!((r.tag(), r.to_vec()), (8, b"hello".to_vec()));
    drop(r);
    // A loan dropped uncommitted sends nothing.
    {
        let _abandoned = c.loan(10).expect("loan");
    }
    // Pool buffers: more frames than buffers, so they must come back to be reused.
    for frame in 0..20u8 {
        let len = 60_000 + usize::from(frame);
        let data = pattern(len, frame);
        let mut p = loop {
            match c.loan_pool(len) {
                Ok(p) => break p,
                Err(SendError::Full) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("pool loan: {e}"),
            }
        };
        p.copy_from_slice(&data);
        p.commit(100).expect("commit");
        let r = c.recv(Some(WATCHDOG)).expect("digest");
        assert_eq!(r.to_vec(), digest(&data));
    }
    eventually("every pool buffer returned", || c.pool_free() == 3);
    assert!(matches!(c.loan_pool(1 << 20), Err(SendError::TooLarge { .. })));
}

#[test]
fn blocking_waits_on_both_sides_and_poll_mode_server() {
    for sleep in [SleepMode::Futex, SleepMode::Poll] {
        let wait = WaitConfig { spin: Duration::ZERO, liveness: Duration::from_millis(20) };
        let server = EchoServer::start(ServerConfig { sleep, wait, ..ServerConfig::default() });
        let mut opts = options(geometry(0));
        opts.wait = wait;
        let mut c = server.client(opts);
        for n in 0..200u32 {
            let (tag, back) = round_trip(&mut c, n, &n.to_le_bytes());
            assert_eq!((tag, back), (n + 1, n.to_le_bytes().to_vec()));
        }
        // On a loaded machine the two sides can ping-pong for ever without the server
        // ever falling asleep (the client's next record lands before it sleeps). Give
        // it the chance between trips until one trip has found it asleep.
        let deadline = Instant::now() + WATCHDOG;
        let mut n = 200u32;
        while c.stats().wakeups == 0 {
            assert!(Instant::now() < deadline, "watchdog: a sleeping server was never woken: {:?}", c.stats());
            std::thread::sleep(Duration::from_millis(5));
            let (tag, back) = round_trip(&mut c, n, &n.to_le_bytes());
            assert_eq!((tag, back), (n + 1, n.to_le_bytes().to_vec()));
            n += 1;
        }
        assert!(c.stats().wakeups > 0, "a sleeping server was woken: {:?}", c.stats());
        assert!(c.stats().wakeups <= c.stats().sent);
    }
}

#[test]
fn a_full_ring_waits_for_room() {
    let server = EchoServer::start(ServerConfig::default());
    let mut c = server.client(options(geometry(0)));
    // Far more than the ring holds, without reading replies in between would fill the
    // reply ring too; read them as they come.
    let mut got = 0;
    for n in 0..2000u32 {
        loop {
            match c.send(n, &[1; 200]) {
                Ok(()) => break,
                Err(SendError::Full) => {
                    while let Some(r) = c.try_recv().expect("recv") {
                        assert_eq!(r.tag(), got + 1);
                        got += 1;
                    }
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    while got < 2000 {
        let r = c.recv(Some(WATCHDOG)).expect("reply");
        assert_eq!(r.tag(), got + 1);
        got += 1;
    }
}

#[test]
fn the_client_descriptor_polls_for_replies_and_hang_ups() {
    let server = EchoServer::start(ServerConfig::default());
    let mut c = server.client(options(geometry(0)));
    c.send(1, b"x").expect("send");
    // Wait in poll, beside any other descriptor.
    loop {
        if !c.arm() {
            break;
        }
        let mut fds = [PollFd::new(&c, PollFlags::IN)];
        let ts = Timespec { tv_sec: WATCHDOG.as_secs() as i64, tv_nsec: 0 };
        assert_eq!(poll(&mut fds, Some(&ts)).expect("poll"), 1, "readable within the watchdog");
        if c.try_recv().expect("recv").is_some() {
            break;
        }
    }
    let _ = c.try_recv();
    // The server going away makes the descriptor readable, and receives fail.
    let srv = server.stop();
    drop(srv);
    let mut fds = [PollFd::new(&c, PollFlags::IN)];
    let ts = Timespec { tv_sec: WATCHDOG.as_secs() as i64, tv_nsec: 0 };
    assert_eq!(poll(&mut fds, Some(&ts)).expect("poll"), 1);
    assert_eq!(c.recv(Some(WATCHDOG)).err(), Some(RecvError::Closed(CloseReason::PeerGone)));
}

#[test]
fn a_refused_geometry_is_refused_with_a_reason() {
    let server = EchoServer::start(ServerConfig { max_channel_bytes: 1 << 20, ..ServerConfig::default() });
    let space = ictus_ipc::Space::new();
    let fd = rustix::io::fcntl_dupfd_cloexec(server.service.as_fd(), 0).expect("dup");
    let name = space.insert_send_fd(fd).expect("insert");
    let big = ictus_shm::Geometry::new(4096, 4096, 64, 1 << 20).expect("valid");
    match ictus_shm::Client::connect(&space, name, options(big)) {
        Err(ictus_shm::ConnectError::Refused(why)) => assert!(why.contains("limit"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn replies_sent_before_the_server_went_away_are_still_delivered() {
    let space = ictus_ipc::Space::new();
    let mut server = ictus_shm::Server::new(&space, ServerConfig::default()).expect("server");
    let service = space.send_right_fd(server.service()).expect("send right");
    let h = std::thread::spawn(move || connect(&service, options(geometry(0))));
    eventually("the client connects", || {
        server.poll_control();
        while server.try_next().is_some() {}
        h.is_finished()
    });
    let mut c = h.join().expect("client");
    for n in 0..3u32 {
        c.send(n, &[n as u8; 10]).expect("send");
    }
    let (tx, _rx) = std::sync::mpsc::channel();
    let mut served = 0;
    eventually("three records served", || {
        while let Some(next) = server.try_next() {
            served += usize::from(matches!(next, ictus_shm::Next::Record(_)));
            echo(next, &tx);
        }
        served == 3
    });
    drop(server);
    for n in 0..3u32 {
        let r = c.recv(Some(WATCHDOG)).expect("a reply sent before the server went");
        assert_eq!((r.tag(), r.to_vec()), (n + 1, vec![n as u8; 10]));
    }
    assert_eq!(c.recv(Some(WATCHDOG)).err(), Some(RecvError::Closed(CloseReason::PeerGone)));
}

#[test]
fn a_quiet_pool_commit_is_found_with_the_record_that_wakes_the_server() {
    let server = EchoServer::start(ServerConfig::default());
    let mut c = server.client(options(geometry(2)));
    // Let the server fall asleep, so that a record would wake it.
    assert!(ictus_testkit::wait_thread_asleep(server.tid), "the server never slept");
    let before = c.stats().wakeups;
    let data = pattern(3000, 5);
    let mut p = c.loan_pool(data.len()).expect("loan");
    p.copy_from_slice(&data);
    p.commit_quietly(100).expect("commit");
    assert_eq!(c.stats().wakeups, before, "a quiet commit wakes nobody");
    c.send(1, b"then this").expect("send");
    // Both answered, in order: the quiet record was found with the one that woke.
    let r = c.recv(Some(WATCHDOG)).expect("digest");
    assert_eq!(r.to_vec(), digest(&data));
    drop(r);
    let r = c.recv(Some(WATCHDOG)).expect("echo");
    assert_eq!((r.tag(), r.to_vec()), (2, b"then this".to_vec()));
    drop(r);
    assert!(c.stats().wakeups <= before + 1, "one wake-up for the two records");
}

#[test]
fn a_server_asleep_in_epoll_takes_a_channel_request_at_once_without_spinning() {
    // Liveness longer than the watchdog: only the request itself can end the sleep.
    let wait = WaitConfig { spin: Duration::ZERO, liveness: WATCHDOG * 2 };
    let space = ictus_ipc::Space::new();
    let mut server =
        ictus_shm::Server::new(&space, ServerConfig { wait, sleep: SleepMode::Futex, ..ServerConfig::default() })
            .expect("server");
    let service = space.send_right_fd(server.service()).expect("send right");
    // With no channel yet the server sleeps in epoll, on the service port.
    let h = std::thread::spawn(move || connect(&service, options(geometry(0))));
    assert!(server.wait(Some(WATCHDOG)).expect("wait"), "woken by the request");
    let Some(ictus_shm::Next::Event(Event::Opened { .. })) = server.try_next() else { panic!("not an open") };
    let _c = h.join().expect("client");
    // One sleep (or two, if the request came after a first look), not a loop of them.
    assert!(server.stats().blocks <= 2, "{} blocks: the sleep spun", server.stats().blocks);
}

#[test]
fn a_held_pool_buffer_outlives_its_record_until_released() {
    let space = ictus_ipc::Space::new();
    let mut server = ictus_shm::Server::new(&space, ServerConfig::default()).expect("server");
    let service = space.send_right_fd(server.service()).expect("send right");
    let h = std::thread::spawn(move || connect(&service, options(geometry(2))));
    let mut id = None;
    eventually("the client connects", || {
        server.poll_control();
        while let Some(next) = server.try_next() {
            if let ictus_shm::Next::Event(Event::Opened { client, .. }) = next {
                id = Some(client);
            }
        }
        h.is_finished()
    });
    let id = id.expect("an open event");
    let mut c = h.join().expect("client");
    let data = pattern(5000, 3);
    let mut p = c.loan_pool(data.len()).expect("loan");
    p.copy_from_slice(&data);
    p.commit(9).expect("commit");
    c.send(10, b"after").expect("send");
    let mut held = None;
    eventually("the pool record, held", || {
        if let Some(ictus_shm::Next::Record(r)) = server.try_next() {
            assert_eq!(r.tag(), 9);
            assert!(r.pool_offset().is_some(), "a pool record has an offset");
            held = r.hold();
        }
        held.is_some()
    });
    let held = held.expect("held");
    assert_eq!(held.client(), id);
    assert_eq!(held.payload().to_vec(), data);
    // The ring moved on: the next record is there while the buffer is still held.
    let Some(ictus_shm::Next::Record(r)) = server.try_next() else { panic!("the in-line record") };
    assert_eq!((r.tag(), r.payload().to_vec()), (10, b"after".to_vec()));
    assert!(r.hold().is_none(), "an in-line record has no buffer to hold");
    // The memfd is the channel's: at the offset, the same bytes.
    let fd = server.channel_fd(id).expect("the channel's memfd");
    let mut buf = vec![0u8; data.len()];
    rustix::io::pread(fd, &mut buf, held.offset()).expect("pread");
    assert_eq!(buf, data);
    assert_eq!(c.pool_free(), 1, "one buffer still held by the server");
    assert!(server.release(held));
    eventually("the buffer comes back", || c.pool_free() == 2);
}

/// A client waiting for a pool buffer sleeps *for room* and is woken by the server's
/// giving one back, not by its liveness period: the client's liveness here is longer
/// than the wait's timeout, so only the wake-up for room can end the wait in time.
#[test]
fn a_client_waiting_for_a_pool_buffer_is_woken_when_one_comes_back() {
    let space = ictus_ipc::Space::new();
    let mut server = ictus_shm::Server::new(&space, ServerConfig::default()).expect("server");
    let service = space.send_right_fd(server.service()).expect("send right");
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        tid_tx.send(ictus_testkit::gettid()).expect("tid");
        let mut opts = options(geometry(1));
        opts.wait = WaitConfig { spin: Duration::ZERO, liveness: 4 * WATCHDOG };
        let mut c = connect(&service, opts);
        let mut p = c.loan_pool(100).expect("loan");
        p.copy_from_slice(&[7; 100]);
        p.commit(9).expect("commit");
        assert!(matches!(c.loan_pool(100), Err(SendError::Full)), "the only buffer is lent");
        let got = c.wait_pool(Some(WATCHDOG));
        (got, c.pool_free())
    });
    let mut held = None;
    eventually("the pool record, held", || {
        server.poll_control();
        while let Some(next) = server.try_next() {
            if let ictus_shm::Next::Record(r) = next {
                assert_eq!(r.tag(), 9);
                held = r.hold();
            }
        }
        held.is_some()
    });
    // Release while the client sleeps for room (awake, it would find the buffer when it
    // looks, and the wake-up for room would go untested).
    let client = tid_rx.recv_timeout(WATCHDOG).expect("the client thread starts");
    assert!(ictus_testkit::wait_thread_asleep(client), "the client never slept waiting for a buffer");
    assert!(server.release(held.expect("held")));
    // The server's next look at the rings wakes a client that sleeps for room.
    eventually("the client wakes with a buffer", || {
        let _ = server.try_next();
        h.is_finished()
    });
    let (got, free) = h.join().expect("client");
    assert!(got.is_ok(), "the wait for a buffer ended without one: {got:?}");
    assert_eq!(free, 1);
}
