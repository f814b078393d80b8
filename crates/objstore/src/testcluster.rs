//! A throw-away single-machine Ceph cluster for tests and experiments: `scripts/ceph.sh
//! up` in a fresh temporary directory, `down` on drop (and by the script's own watcher
//! if this process dies first, even by `kill -9`).
//!
//! Where Ceph cannot run (its daemons or client libraries are not installed),
//! [`TestCluster::start_or_skip`] prints why and returns `None`, so a test says it was
//! skipped rather than passing in silence; under CI (`CI` set) or with
//! `ICTUS_REQUIRE_CEPH=1` that is a failure instead, since there Ceph must run.
//!
//! **A shared cluster.** Starting Ceph takes 10–50 s on a loaded two-core machine, so the
//! test command (`scripts/test.sh`) starts one for the whole suite and names its
//! configuration in [`SHARED_ENV`]. [`TestCluster::start_or_skip`] then makes the test a
//! pool of its own on that cluster (dropped with it) instead of starting a cluster: tests
//! stay independent (no object of one is seen by another), and the cluster is not the
//! test's to stop. Without the variable every test starts its own, as before.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The variable naming a running cluster's configuration file (`DIR/ceph.conf` of a
/// `scripts/ceph.sh up DIR`) that tests share.
pub const SHARED_ENV: &str = "ICTUS_TEST_CEPH_CONF";

/// A running cluster, stopped and removed on drop; or a pool of its own on a shared
/// cluster, deleted on drop.
#[derive(Debug)]
pub struct TestCluster {
    dir: PathBuf,
    conf: PathBuf,
    pool: String,
    started_in: Duration,
    /// On a shared cluster (not this value's to stop): only its pool is its own.
    shared: bool,
}

/// The shared cluster's configuration, if the test command named one.
pub fn shared_conf() -> Option<PathBuf> {
    std::env::var_os(SHARED_ENV).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The set-up script: `ICTUS_CEPH_SCRIPT`, else the repository's `scripts/ceph.sh`.
pub fn script() -> PathBuf {
    std::env::var_os("ICTUS_CEPH_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph.sh"))
}

/// Why Ceph cannot run here, or `None` if it can.
pub fn unavailable() -> Option<String> {
    let missing: Vec<&str> = ["ceph-mon", "ceph-mgr", "ceph-osd", "ceph", "rados", "monmaptool"]
        .into_iter()
        .filter(|tool| {
            !std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
                .unwrap_or(false)
        })
        .collect();
    if !missing.is_empty() {
        return Some(format!(
            "{} not installed (Debian: ceph-mon ceph-mgr ceph-osd ceph-common; scripts/setup.sh installs them)",
            missing.join(", ")
        ));
    }
    if let Err(e) = crate::ffi::Lib::load() {
        return Some(e);
    }
    if !script().is_file() {
        return Some(format!("{} not found", script().display()));
    }
    None
}

fn required() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
        || std::env::var_os("ICTUS_REQUIRE_CEPH").is_some_and(|v| v == "1")
}

impl TestCluster {
    /// Starts a cluster of `osds` OSDs (1 to 3) on BlueStore, or says why it failed.
    /// It goes when this process does, if not dropped before.
    pub fn start(osds: u8) -> Result<TestCluster, String> {
        TestCluster::start_owned(osds, std::process::id())
    }

    /// As [`TestCluster::start`], but the cluster goes when process `owner` does.
    pub fn start_owned(osds: u8, owner: u32) -> Result<TestCluster, String> {
        TestCluster::start_at(osds, owner, None)
    }

    /// As [`TestCluster::start_owned`], with the daemons on local address `addr` (a
    /// bridge's, for clients in other network namespaces) instead of 127.0.0.1.
    pub fn start_at(osds: u8, owner: u32, addr: Option<std::net::Ipv4Addr>) -> Result<TestCluster, String> {
        if let Some(why) = unavailable() {
            return Err(why);
        }
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ictus-ceph-{}-{n}", std::process::id()));
        let t = Instant::now();
        let out = Command::new("bash")
            .arg(script())
            .arg("up")
            .arg(&dir)
            .args(["--osds", &osds.to_string(), "--owner", &owner.to_string()])
            .args(addr.map(|a| ["--addr".to_string(), a.to_string()]).into_iter().flatten())
            .output()
            .map_err(|e| format!("running {}: {e}", script().display()))?;
        let started_in = t.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "ceph.sh up failed ({}):\n{}{}",
                out.status,
                stdout,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let field = |k: &str| stdout.lines().find_map(|l| l.strip_prefix(k).map(str::to_string));
        let (Some(conf), Some(pool)) = (field("conf="), field("pool=")) else {
            return Err(format!("ceph.sh up printed no conf= and pool= lines:\n{stdout}"));
        };
        Ok(TestCluster { dir, conf: PathBuf::from(conf), pool, started_in, shared: false })
    }

    /// A pool of its own (named after `test` and this process) on the running cluster
    /// whose configuration is `conf` (made by `scripts/ceph.sh up`); the pool is deleted
    /// on drop, the cluster left running.
    pub fn join(conf: &Path, test: &str) -> Result<TestCluster, String> {
        let dir = conf.parent().filter(|d| d.join("ceph.conf") == conf).ok_or_else(|| {
            format!("{SHARED_ENV}={}: not the ceph.conf of a scripts/ceph.sh cluster", conf.display())
        })?;
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stem: String = test
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
            .take(40)
            .collect();
        let pool = format!("t-{stem}-{}-{n}", std::process::id());
        let t = Instant::now();
        let out = Command::new("bash")
            .arg(script())
            .args(["pool".as_ref(), dir.as_os_str(), pool.as_ref()])
            .output()
            .map_err(|e| format!("running {}: {e}", script().display()))?;
        if !out.status.success() {
            return Err(format!(
                "ceph.sh pool {} {pool} failed ({}): {}",
                dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(TestCluster {
            dir: dir.to_path_buf(),
            conf: conf.to_path_buf(),
            pool,
            started_in: t.elapsed(),
            shared: true,
        })
    }

    /// Whether this is a pool on a shared cluster (the cluster is not this value's).
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// Starts a cluster — or, when the test command shares one ([`SHARED_ENV`]) and
    /// `osds` is 1, makes this test a pool of its own on it — or prints why Ceph cannot
    /// run here and returns `None` (a failure instead under CI or
    /// `ICTUS_REQUIRE_CEPH=1`). A cluster that can run but fails to start is a failure.
    pub fn start_or_skip(test: &str, osds: u8) -> Option<TestCluster> {
        if let (Some(conf), 1) = (shared_conf(), osds) {
            return match TestCluster::join(&conf, test) {
                Ok(c) => {
                    eprintln!("{test}: on the shared cluster {}, pool {}", conf.display(), c.pool());
                    Some(c)
                }
                Err(e) => panic!("{test}: {e}"),
            };
        }
        if let Some(why) = unavailable() {
            if required() {
                panic!("{test}: Ceph is required here (CI or ICTUS_REQUIRE_CEPH=1) but cannot run: {why}");
            }
            eprintln!("SKIPPED {test}: Ceph cannot run here: {why}");
            return None;
        }
        match TestCluster::start(osds) {
            Ok(c) => Some(c),
            Err(e) => panic!("{test}: {e}"),
        }
    }

    /// Its configuration file (for [`crate::Rados::connect`]).
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The pool made for tests.
    pub fn pool(&self) -> &str {
        &self.pool
    }

    /// The directory holding everything.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Time from nothing to HEALTH_OK with every OSD up (on a shared cluster: to make
    /// the pool).
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// `ceph.sh status` output.
    pub fn status(&self) -> String {
        Command::new("bash")
            .arg(script())
            .arg("status")
            .arg(&self.dir)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
            .unwrap_or_else(|e| e.to_string())
    }

    /// Stops every daemon and removes the directory; an error says what was left.
    pub fn stop(mut self) -> Result<(), String> {
        self.down()
    }

    fn down(&mut self) -> Result<(), String> {
        if !self.dir.exists() {
            return Ok(());
        }
        if self.shared {
            // Only the pool is this test's; the objects go with it.
            let out = Command::new("bash")
                .arg(script())
                .args(["unpool".as_ref(), self.dir.as_os_str(), self.pool.as_ref()])
                .output()
                .map_err(|e| format!("running ceph.sh unpool: {e}"))?;
            self.shared = false;
            self.dir = PathBuf::new();
            return if out.status.success() {
                Ok(())
            } else {
                Err(format!("ceph.sh unpool {}: {}", self.pool, String::from_utf8_lossy(&out.stderr)))
            };
        }
        let out = Command::new("bash")
            .arg(script())
            .arg("down")
            .arg(&self.dir)
            .output()
            .map_err(|e| format!("running ceph.sh down: {e}"))?;
        if out.status.success() && !self.dir.exists() {
            Ok(())
        } else {
            Err(format!("ceph.sh down {}: {}", self.dir.display(), String::from_utf8_lossy(&out.stderr)))
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if let Err(e) = self.down() {
            eprintln!("{e}");
        }
    }
}
