//! Behaviour of the raw peers across real processes: servers echo what they receive,
//! batches return one sample per round trip, and servers exit cleanly when told to.
//!
//! This test re-executes its own binary as the servers, so it has its own `main`
//! (`harness = false`), which must hand over to `maybe_run_child` first. It asserts
//! behaviour only, never a duration.

use std::path::Path;

use ictus_bench::child::spawn_child;
use ictus_bench::{Role, Transport};
use ictus_experiments::peers::echo::{PipePeer, SeqpacketPeer};
use ictus_experiments::peers::futex::FutexPeer;
use ictus_experiments::peers::CHUNK;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn gone(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

fn stream_peers() {
    // Several chunks and a ragged end exercise the chunked framing.
    let big = 3 * CHUNK + 123;
    for reply_len in [1, 8, big] {
        let mut seq = SeqpacketPeer::spawn_seqpacket(reply_len).expect("spawn seqpacket");
        let mut pipe = PipePeer::spawn_pipe(reply_len).expect("spawn pipe");
        for size in [1, 64, big] {
            let request = pattern(size, size as u8);
            let echoed = size.min(reply_len);
            let reply = seq.exchange(&request).expect("seqpacket exchange");
            assert_eq!(reply.len(), reply_len);
            assert_eq!(reply[..echoed], request[..echoed], "seqpacket {size}");
            let reply = pipe.exchange(&request).expect("pipe exchange");
            assert_eq!(reply.len(), reply_len);
            assert_eq!(reply[..echoed], request[..echoed], "pipe {size}");
        }
        for t in [&mut seq as &mut dyn Transport, &mut pipe] {
            assert_eq!(t.round_trips(4096, 10).expect("batch").len(), 10);
            assert_eq!(t.round_trips(big, 3).expect("batch").len(), 3);
            assert!(t.round_trips(0, 1).is_err(), "empty messages are refused");
        }
        let pids = [seq.server_pid(), pipe.server_pid()].map(|p| p.expect("a server pid"));
        assert!(seq.shutdown().expect("seqpacket shutdown").success());
        assert!(pipe.shutdown().expect("pipe shutdown").success());
        assert!(pids.iter().all(|&pid| gone(pid)), "servers reaped");
    }
}

fn futex_peer() {
    let capacity = 1 << 20;
    let mut peer = FutexPeer::spawn(1000, capacity).expect("spawn futex");
    for size in [1, 1000, 5000, capacity] {
        let request = pattern(size, 3);
        let reply = peer.exchange(&request).expect("futex exchange");
        assert_eq!(reply.len(), 1000);
        let echoed = size.min(1000);
        assert_eq!(reply[..echoed], request[..echoed], "futex {size}");
    }
    assert_eq!(peer.round_trips(64, 100).expect("batch").len(), 100);
    assert!(peer.round_trips(capacity + 1, 1).is_err(), "over capacity is refused");
    let pid = peer.server_pid().expect("a server pid");
    assert!(peer.shutdown().expect("futex shutdown").success());
    assert!(gone(pid));
}

fn unknown_role_fails() {
    static UNKNOWN: Role = Role { name: "no-such-role", run: |_| 0 };
    let status = spawn_child(&UNKNOWN, &[], &[]).expect("spawn").wait().expect("wait");
    assert_eq!(status.code(), Some(2));
}

fn main() {
    // The servers are the `ipc` experiment's peers.
    ictus_bench::maybe_run_child(&[&ictus_experiments::ipc::IPC]);
    let tests: [(&str, fn()); 3] =
        [("stream_peers", stream_peers), ("futex_peer", futex_peer), ("unknown_role_fails", unknown_role_fails)];
    for (name, test) in tests {
        test();
        println!("test {name} ... ok");
    }
}
