//! Channels as futures (`ictus_shm::aio`, feature `tokio`): an async server serving async
//! and blocking clients on one current-thread runtime, a send that waits for room, a
//! server that goes away, and no thread per channel.
#![cfg(not(loom))]

mod common;

use common::*;
use ictus_ipc::Space;
use ictus_shm::aio::{AsyncClient, AsyncServer, RegisterError};
use ictus_shm::{Client, CloseReason, Event, Next, RecvError, Server, ServerConfig};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(WATCHDOG, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: still waiting after the {WATCHDOG:?} watchdog (a lost wake-up?)"),
    }
}

/// An async echo server on a thread of its own (its runtime's only thread), until
/// `records` records have been answered and every channel closed again.
fn spawn_async_echo(records: usize) -> (std::thread::JoinHandle<(usize, usize)>, std::os::fd::OwnedFd) {
    let space = Space::new();
    let server = Server::new(&space, ServerConfig::default()).expect("server");
    let service = space.send_right_fd(server.service()).expect("service right");
    let t = std::thread::spawn(move || {
        runtime().block_on(async move {
            let mut server = AsyncServer::new(server).expect("register the server");
            let (mut answered, mut open, mut opened) = (0usize, 0usize, 0usize);
            while answered < records || open > 0 {
                let step = bounded(
                    "next",
                    server.next_with(|next| match next {
                        Next::Event(Event::Opened { .. }) => 1,
                        Next::Event(Event::Closed { .. }) => -1,
                        Next::Record(mut r) => {
                            let data = r.payload().to_vec();
                            let tag = r.tag() + 1;
                            if r.reply(tag, &data).is_err() {
                                r.retry_later();
                                return 2;
                            }
                            0
                        }
                    }),
                )
                .await
                .expect("next");
                match step {
                    1 => {
                        open += 1;
                        opened += 1;
                    }
                    -1 => open -= 1,
                    0 => answered += 1,
                    _ => tokio::task::yield_now().await,
                }
            }
            (answered, opened)
        })
    });
    (t, service)
}

#[test]
fn an_async_server_serves_async_and_blocking_clients() {
    const CLIENTS: usize = 4;
    const TRIPS: usize = 200;
    let (server, service) = spawn_async_echo(CLIENTS * TRIPS);
    let space = Space::new();
    let service = space.insert_send_fd(service).expect("service");
    // One blocking client on a thread of its own.
    let s2 = space.clone();
    let blocking = std::thread::spawn(move || {
        let mut c = Client::connect(&s2, service, options(geometry(0))).expect("connect");
        for i in 0..TRIPS {
            let (tag, back) = round_trip(&mut c, i as u32, &pattern(i % 300, 9));
            assert_eq!((tag, back), (i as u32 + 1, pattern(i % 300, 9)));
        }
    });
    // Three async clients on one current-thread runtime.
    runtime().block_on(async {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let mut tasks = Vec::new();
                for k in 0..CLIENTS - 1 {
                    // Connecting is one call to the server's port; it runs on another
                    // thread, so blocking here is brief.
                    let c = Client::connect(&space, service, options(geometry(0))).expect("connect");
                    tasks.push(tokio::task::spawn_local(async move {
                        let mut c = AsyncClient::new(c).expect("register");
                        for i in 0..TRIPS {
                            let data = pattern((i * 7) % 500, k as u8);
                            bounded("send", c.send(i as u32, &data)).await.expect("send");
                            let (tag, back) = bounded("recv", c.recv()).await.expect("recv");
                            assert_eq!((tag, back), (i as u32 + 1, data), "client {k} trip {i}");
                        }
                    }));
                }
                for t in tasks {
                    t.await.expect("client task");
                }
            })
            .await;
    });
    blocking.join().expect("blocking client");
    let (answered, opened) = server.join().expect("server thread");
    assert_eq!((answered, opened), (CLIENTS * TRIPS, CLIENTS));
}

#[test]
fn a_send_waits_for_room_while_the_server_catches_up() {
    let (server, service) = spawn_async_echo(64);
    let space = Space::new();
    let service = space.insert_send_fd(service).expect("service");
    let c = Client::connect(&space, service, options(geometry(0))).expect("connect");
    runtime().block_on(async {
        let mut c = AsyncClient::new(c).expect("register");
        // 64 records of 1000 bytes do not fit a 4 KiB ring at once: sends wait for room
        // while replies are read in between by a second loop below.
        let data = vec![0x5a; 1000];
        let mut got = 0;
        for i in 0..64u32 {
            bounded("send", c.send(i, &data)).await.expect("send");
            // Read whatever replies are there, so the server is never stuck on a full
            // reply ring.
            while let Ok(Some(r)) = c.get_mut().try_recv() {
                assert_eq!(r.tag(), got + 1);
                got += 1;
            }
        }
        while got < 64 {
            let (tag, _) = bounded("recv", c.recv()).await.expect("recv");
            assert_eq!(tag, got + 1);
            got += 1;
        }
    });
    server.join().expect("server");
}

#[test]
fn a_server_that_goes_away_ends_a_waiting_receive() {
    let space = Space::new();
    let server = Server::new(&space, ServerConfig::default()).expect("server");
    let service = space.send_right_fd(server.service()).expect("right");
    let (go, went) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        runtime().block_on(async move {
            let mut server = AsyncServer::new(server).expect("register");
            let opened = bounded("open", server.next_with(|n| matches!(n, Next::Event(Event::Opened { .. })))).await;
            assert!(opened.expect("next"), "the first thing is the client's open");
            // The client waits for a reply that never comes; then the server goes.
            went.recv().expect("go");
            drop(server);
        });
    });
    let client_space = Space::new();
    let service = client_space.insert_send_fd(service).expect("service");
    let c = Client::connect(&client_space, service, options(geometry(0))).expect("connect");
    drop(space);
    runtime().block_on(async {
        let mut c = AsyncClient::new(c).expect("register");
        let waiting = c.recv();
        go.send(()).expect("go");
        let e = bounded("recv", waiting).await.expect_err("the server is gone");
        assert_eq!(e, RecvError::Closed(CloseReason::PeerGone));
    });
    t.join().expect("server thread");
}

#[test]
fn registering_outside_a_runtime_is_an_error() {
    let space = Space::new();
    let server = Server::new(&space, ServerConfig::default()).expect("server");
    let e = AsyncServer::new(server).expect_err("no runtime");
    assert!(matches!(e, RegisterError::NoRuntime), "{e:?}");
}
