//! Striped objects on a real single-machine Ceph cluster (`scripts/ceph.sh`): uploads,
//! ranged reads across stripe units and objects checked byte for byte, a stream read
//! through the prefetching reader, refusals with clear errors, and a cluster whose owner
//! is killed with SIGKILL taken down by its watcher, leaving nothing behind.
//!
//! One cluster for the whole file (it takes 10–25 s to start on a loaded 2-core machine).
//! Skipped with a printed reason where Ceph cannot run; required under CI.
//!
//! On the test command's shared cluster (`ICTUS_TEST_CEPH_CONF`, see `testcluster`) the
//! test works in a pool of its own, and the parts that kill the cluster (its OSD, its
//! owner) run only when `ICTUS_TEST_CEPH_OWNER` also names the shared cluster's owner:
//! `scripts/test.sh` runs this test once more that way as its last use of the cluster.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ictus_objstore::prefetch::Window;
use ictus_objstore::testcluster::TestCluster;
use ictus_objstore::{Error, Layout, Rados, StreamReader};

/// Deterministic bytes that differ at every offset of a stripe (no period of 2^k).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn pids_of(dir: &std::path::Path) -> Vec<u32> {
    std::fs::read_dir(dir.join("run"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().extension().is_some_and(|x| x == "pid"))
                .filter_map(|e| std::fs::read_to_string(e.path()).ok()?.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| !s.lines().any(|l| l.starts_with("State:") && l.contains('Z')))
        .unwrap_or(false)
}

/// The cluster's owner: a child killed and reaped on drop, also when the test fails.
struct Owner(std::process::Child);

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn striped_objects_on_a_real_cluster() {
    // The cluster's owner is a child that this test kills with SIGKILL at the end: the
    // script's watcher must then take the whole cluster down by itself.
    if let Some(why) = ictus_objstore::testcluster::unavailable() {
        // start_or_skip prints or fails as the environment requires.
        assert!(TestCluster::start_or_skip("striped_objects_on_a_real_cluster", 1).is_none(), "{why}");
        return;
    }
    // Own cluster and owner, or a pool on the shared one (and its owner's pid, if this
    // run may kill it).
    let (cluster, mut owner, shared_owner) = match ictus_objstore::testcluster::shared_conf() {
        Some(conf) => {
            let c = TestCluster::join(&conf, "striped_objects_on_a_real_cluster").unwrap_or_else(|e| panic!("{e}"));
            let owner = std::env::var("ICTUS_TEST_CEPH_OWNER").ok().map(|p| {
                p.trim().parse::<u32>().unwrap_or_else(|_| panic!("ICTUS_TEST_CEPH_OWNER={p}: not a process id"))
            });
            (c, None, owner)
        }
        None => {
            let owner = Owner(Command::new("sleep").arg("600").stdin(Stdio::null()).spawn().expect("spawn sleep"));
            let c = TestCluster::start_owned(1, owner.0.id()).unwrap_or_else(|e| panic!("{e}"));
            (c, Some(owner), None)
        }
    };
    eprintln!(
        "{} in {:.1} s at {}",
        if cluster.is_shared() { "pool made on the shared cluster" } else { "cluster up" },
        cluster.started_in().as_secs_f64(),
        cluster.dir().display()
    );
    let dir = cluster.dir().to_path_buf();
    let daemons = pids_of(&dir);
    assert!(daemons.len() >= 3, "mon, mgr and an OSD recorded: {daemons:?}");

    let rados = Rados::connect(cluster.conf(), 20).expect("connect");
    // Small units so a few MiB cross many stripe units and objects.
    let layout = Layout { stripe_unit: 64 << 10, stripe_count: 3, object_size: 256 << 10 };
    let s = rados.striper(cluster.pool(), layout).expect("striper");

    // Upload from a file, as `put` would.
    let data = pattern(5 * 1024 * 1024 + 12_345, 7);
    let src = std::env::temp_dir().join(format!("ictus-objstore-src-{}", std::process::id()));
    std::fs::write(&src, &data).unwrap();
    assert_eq!(s.put_file("films/clip.bin", &src).unwrap(), data.len() as u64);
    let _ = std::fs::remove_file(&src);
    assert_eq!(s.stat("films/clip.bin").unwrap(), data.len() as u64);

    // Refusals: an existing name, bad names, a missing object, a bad layout.
    assert!(matches!(s.put("films/clip.bin", &mut &b"x"[..], 1), Err(Error::Exists(_))));
    for bad in ["", "../x", "a b", "a\0b"] {
        assert!(matches!(s.stat(bad), Err(Error::BadName(_))), "{bad:?}");
    }
    assert!(matches!(s.stat("nothing/here"), Err(Error::NotFound(_))));
    assert!(matches!(s.read_at("nothing/here", 0, &mut [0u8; 10]), Err(Error::NotFound(_))));
    let bad = Layout { stripe_unit: 1000, ..layout };
    assert!(matches!(rados.striper(cluster.pool(), bad), Err(Error::Layout(_))));
    assert!(rados.striper("no-such-pool", layout).is_err());
    // A source shorter than announced: refused, and nothing left behind.
    assert!(matches!(s.put("short", &mut &b"abc"[..], 10), Err(Error::Source(_))));
    assert!(matches!(s.stat("short"), Err(Error::NotFound(_))));

    // Ranged reads across stripe units, objects and object sets, byte for byte.
    let unit = 64 << 10;
    let set = 3 * (256 << 10);
    for (off, len) in [
        (0usize, 1usize),
        (unit - 1, 2),
        (unit - 100, 3 * unit + 200),
        (set - 5000, 10_000),
        (2 * set + 17, set + 1),
        (data.len() - 10, 10),
    ] {
        let mut buf = vec![0u8; len];
        assert_eq!(s.read_at("films/clip.bin", off as u64, &mut buf).unwrap(), len);
        assert!(buf == data[off..off + len], "range {off}+{len}");
    }
    // Past the end: short, then empty.
    let mut buf = vec![0u8; 100];
    assert_eq!(s.read_at("films/clip.bin", data.len() as u64 - 40, &mut buf).unwrap(), 40);
    assert_eq!(s.read_at("films/clip.bin", data.len() as u64 + 5, &mut buf).unwrap(), 0);
    // Asynchronous reads, several at once, completing in any order.
    let pending: Vec<_> = (0..6).map(|i| s.read_async("films/clip.bin", i * 700_001, 300_000).unwrap()).collect();
    for (i, p) in pending.into_iter().enumerate() {
        let off = i * 700_001;
        assert!(p.wait().unwrap() == data[off..off + 300_000], "aio {i}");
    }
    // One dropped before it completes: dropping waits for it.
    drop(s.read_async("films/clip.bin", 0, 1 << 20).unwrap());

    // A stream through the prefetching reader: sequential 64 KiB reads, then a seek.
    let window = Window { chunk: 256 << 10, ahead: 2 << 20, max_in_flight: 8 };
    let mut r = StreamReader::open(&s, "films/clip.bin", window).unwrap();
    let mut out = Vec::with_capacity(data.len());
    let mut piece = vec![0u8; 64 << 10];
    let t = Instant::now();
    loop {
        let n = r.read_at(out.len() as u64, &mut piece).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&piece[..n]);
    }
    let secs = t.elapsed().as_secs_f64();
    assert!(out == data, "streamed bytes differ");
    let st = r.stats();
    eprintln!(
        "streamed {} MiB in {:.3} s ({:.0} MB/s): {:?}",
        data.len() >> 20,
        secs,
        data.len() as f64 / secs / 1e6,
        st
    );
    assert_eq!(st.served, data.len() as u64);
    assert!(st.fetched >= data.len() as u64);
    // Reads are 64 KiB in 256 KiB chunks: most find their bytes already in.
    assert!(st.hits > st.stalls, "{st:?}");
    assert!(r.buffered() <= window.ahead + window.chunk);
    let mut b = vec![0u8; 5000];
    assert_eq!(r.read_at(3_000_000, &mut b).unwrap(), 5000);
    assert!(b == data[3_000_000..3_005_000]);
    assert!(matches!(r.read_at(data.len() as u64 + 1, &mut b), Err(Error::Range { .. })));
    drop(r);

    s.remove("films/clip.bin").unwrap();
    assert!(matches!(s.stat("films/clip.bin"), Err(Error::NotFound(_))));
    s.write_at("last", 0, &data[..100_000]).unwrap();
    drop(s);
    drop(rados);
    if cluster.is_shared() && shared_owner.is_none() {
        eprintln!(
            "the shared cluster: its OSD and its owner are killed in scripts/test.sh's last step (ICTUS_TEST_CEPH_OWNER), not here"
        );
        return;
    }

    // The only OSD dies by SIGKILL: a read fails within the connection's time-out
    // (5 s here) with an error that says so, rather than hanging.
    let rados = Rados::connect(cluster.conf(), 5).expect("connect again");
    let s = rados.striper(cluster.pool(), layout).expect("striper");
    let osd: u32 = std::fs::read_to_string(dir.join("run/osd.0.pid")).unwrap().trim().parse().unwrap();
    Command::new("kill").args(["-9", &osd.to_string()]).status().unwrap();
    let t = Instant::now();
    let mut b = vec![0u8; 100_000];
    let got = s.read_at("last", 0, &mut b);
    eprintln!("read with the OSD dead: {got:?} after {:.1} s", t.elapsed().as_secs_f64());
    assert!(matches!(got, Err(Error::Rados { errno, .. }) if errno == libc::ETIMEDOUT), "{got:?}");
    drop(s);
    drop(rados);

    // The owner dies by SIGKILL: the watcher takes every daemon down and removes the
    // directory, without this test's help.
    match (owner.as_mut(), shared_owner) {
        (Some(o), _) => {
            o.0.kill().unwrap();
            o.0.wait().unwrap();
        }
        (None, Some(pid)) => {
            assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success(), "kill -9 {pid}");
        }
        (None, None) => unreachable!("returned above"),
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while dir.exists() || daemons.iter().any(|&p| running(p)) {
        assert!(Instant::now() < deadline, "cluster left after its owner died: {}", cluster.status());
        std::thread::sleep(Duration::from_millis(200));
    }
    // Dropping it now finds nothing to do.
    cluster.stop().unwrap();
}
