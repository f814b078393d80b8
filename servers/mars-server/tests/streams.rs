//! The streams API on ports, through the generated stubs: many streams in one call,
//! client-driven read/send, server-paced streams with admission control, and a client
//! killed mid-stream (`kill -9`) whose buffers, connection and owner record go away.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use ictus_idl::SendRight;
use ictus_ipc::{Disposition, Space};
use ictus_mars_server::api::ApiServer;
use ictus_mars_server::protocol::{StreamsClient, STATE_WORDS};
use ictus_mars_server::{EngineConfig, Volume};

const CHILD_ENV: &str = "ICTUS_MARS_STREAM_CHILD";
const BIG: usize = 24 << 20;

/// The ports side, with a stop pipe (reader, writer).
fn api(server: &ictus_mars_server::Running, space: &Space) -> (ApiServer, UnixStream, UnixStream) {
    let api = ApiServer::new(space.clone(), server.handle.clone().unwrap()).unwrap();
    let (r, w) = UnixStream::pair().unwrap();
    (api, r, w)
}

fn volume_with_big(dir: &std::path::Path) -> (Vec<std::path::PathBuf>, Vec<u8>) {
    let comps: Vec<_> = (0..2).map(|i| dir.join(format!("s{i}.img"))).collect();
    let mut v = Volume::create(&comps, 64 << 10, Some(40 << 20)).unwrap();
    let big = pattern(BIG, 11);
    std::fs::write(dir.join("big.src"), &big).unwrap();
    v.add_file("big.bin", &dir.join("big.src"), 4.0).unwrap();
    (comps, big)
}

#[test]
fn many_streams_in_one_call_driven_by_the_client() {
    let dir = TempDir::new("api");
    let (comps, big) = volume_with_big(dir.path());
    let server = start(&comps, EngineConfig::default(), false);
    let space = Space::new();
    let (mut api, stop_r, stop_w) = api(&server, &space);
    let port = api.streams_port();
    let client_space = Space::new();
    let (send, _) = client_space.extract_right(&space, port, Disposition::MakeSend).unwrap();
    let t = std::thread::spawn(move || api.run(None, stop_r.as_fd()).map(|_| api.owners()));
    let c = StreamsClient::new(&client_space, send).with_timeout(Duration::from_secs(30));
    let owner = client_space.allocate_port().unwrap();
    let listeners: Vec<TcpListener> = (0..3).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let dests: Vec<String> = listeners.iter().map(|l| l.local_addr().unwrap().to_string()).collect();
    let offsets = vec![0u64, 1_000_000, (BIG - 5000) as u64];
    let (ids, why) = c
        .open(
            SendRight::make(owner),
            vec!["big.bin".into(), "big.bin".into(), "big.bin".into()],
            dests.clone(),
            offsets.clone(),
            vec![0, 0, 0],
            4,
        )
        .unwrap();
    assert!(ids.iter().all(|&i| i != 0), "{why:?}");
    // A refused stream in a batch: its id is 0 and the reason says why.
    let extra = TcpListener::bind("127.0.0.1:0").unwrap();
    let (bad, why_bad) = c
        .open(
            SendRight::make(owner),
            vec!["no-such".into()],
            vec![extra.local_addr().unwrap().to_string()],
            vec![0],
            vec![0],
            4,
        )
        .unwrap();
    assert_eq!(bad, vec![0]);
    assert!(why_bad[0].contains("no stream"), "{why_bad:?}");
    // Readers for the three destinations.
    let readers: Vec<_> = listeners
        .into_iter()
        .map(|l| {
            std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                let mut got = Vec::new();
                s.read_to_end(&mut got).unwrap();
                got
            })
        })
        .collect();
    // Drive all three with one call per step until every one is done.
    assert!(eventually(Duration::from_secs(120), || {
        c.read_send(ids.clone()).unwrap();
        let w = c.state(ids.clone()).unwrap();
        w.chunks(STATE_WORDS).all(|s| s[1] == 2)
    }));
    for ((r, off), id) in readers.into_iter().zip(&offsets).zip(&ids) {
        let got = r.join().unwrap();
        assert_eq!(got.len(), BIG - *off as usize, "stream {id:#x}");
        assert!(got == big[*off as usize..], "stream {id:#x} byte for byte");
    }
    c.close(ids.clone()).unwrap();
    let h = server.handle.clone().unwrap();
    assert!(eventually(Duration::from_secs(30), || {
        let s = h.stats().unwrap();
        s.buffers_free == s.buffers && s.connections == 0
    }));
    let stats = c.stats().unwrap();
    assert_eq!(stats.len(), ictus_mars_server::protocol::STATS_WORDS);
    assert!(c.read(vec![]).is_err(), "an empty batch is refused");
    drop(stop_w);
    t.join().unwrap().unwrap();
    server.stop();
}

#[test]
fn a_paced_stream_is_admitted_against_the_measured_capability() {
    let dir = TempDir::new("api-paced");
    let (comps, big) = volume_with_big(dir.path());
    let server = start(&comps, EngineConfig::default(), false); // capability 100 MB/s, 80 % reservable
    let space = Space::new();
    let (mut api, stop_r, stop_w) = api(&server, &space);
    let client_space = Space::new();
    let (send, _) = client_space.extract_right(&space, api.streams_port(), Disposition::MakeSend).unwrap();
    let t = std::thread::spawn(move || api.run(None, stop_r.as_fd()));
    let c = StreamsClient::new(&client_space, send).with_timeout(Duration::from_secs(30));
    let owner = client_space.allocate_port().unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let too_much = TcpListener::bind("127.0.0.1:0").unwrap();
    let (ids, why) = c
        .open(
            SendRight::make(owner),
            vec!["big.bin".into(), "big.bin".into()],
            vec![l.local_addr().unwrap().to_string(), too_much.local_addr().unwrap().to_string()],
            vec![(BIG - (4 << 20)) as u64, 0],
            vec![16_000_000, 70_000_000],
            4,
        )
        .unwrap();
    assert_ne!(ids[0], 0, "{why:?}");
    assert_eq!(ids[1], 0, "16 + 70 MB/s is over 80 MB/s");
    assert!(why[1].contains("admission refused"), "{why:?}");
    let (mut s, _) = l.accept().unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert!(got == big[BIG - (4 << 20)..], "the paced stream, byte for byte");
    let w = c.state(vec![ids[0]]).unwrap();
    assert_eq!(w[1], 2, "done");
    assert!(w[7] >= 16, "one slot per chunk: {w:?}");
    c.close(vec![ids[0]]).unwrap();
    drop(stop_w);
    t.join().unwrap().unwrap();
    server.stop();
}

/// The child: opens a stream to itself, reads a little, then stops reading (so the
/// server's sends stall with buffers held), says READY and waits to be killed.
#[test]
fn child_entry() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let space = Space::task();
    let port = space.take_bootstrap().unwrap().expect("a bootstrap port");
    let c = StreamsClient::new(&space, port).with_timeout(Duration::from_secs(30));
    let owner = space.allocate_port().unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let (ids, why) = c
        .open(
            SendRight::make(owner),
            vec!["big.bin".into()],
            vec![l.local_addr().unwrap().to_string()],
            vec![0],
            vec![0],
            8,
        )
        .unwrap();
    assert_ne!(ids[0], 0, "{why:?}");
    let (mut s, _) = l.accept().unwrap();
    for _ in 0..64 {
        c.read_send(ids.clone()).unwrap();
    }
    let mut first = vec![0u8; 1 << 20];
    s.read_exact(&mut first).unwrap();
    assert!(first == pattern(BIG, 11)[..1 << 20]);
    c.read_send(ids.clone()).unwrap();
    println!("READY");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_client_killed_mid_stream_frees_its_buffers() {
    let dir = TempDir::new("api-kill");
    let (comps, _) = volume_with_big(dir.path());
    let server = start(&comps, EngineConfig::default(), false);
    let h = server.handle.clone().unwrap();
    let space = Space::new();
    let (mut api, stop_r, stop_w) = api(&server, &space);
    let port = api.streams_port();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"]).env(CHILD_ENV, "1").stdout(Stdio::piped());
    space.give_bootstrap(&mut cmd, port).unwrap();
    let owners = api.owners_handle();
    let t = std::thread::spawn(move || api.run(None, stop_r.as_fd()).unwrap());
    let mut child = cmd.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("READY") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child exited before READY");
    }
    assert!(eventually(Duration::from_secs(30), || owners.owners() == 1), "the owner is recorded");
    let s = h.stats().unwrap();
    assert!(s.buffers_free < s.buffers, "the stalled stream holds buffers: {s:?}");
    assert_eq!(s.connections, 1);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(60), || {
            let s = h.stats().unwrap();
            s.buffers_free == s.buffers && s.connections == 0 && owners.owners() == 0
        }),
        "after kill -9: {:?}, owners {}",
        h.stats(),
        owners.owners()
    );
    drop(stop_w);
    t.join().unwrap();
    server.stop();
}
