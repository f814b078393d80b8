//! The processes the experiment starts and always stops: our stream nodes (this binary
//! re-executed as the role `mars-cluster-node`) and nginx (nodes and the front).
//!
//! Every child is started with `PR_SET_PDEATHSIG` = SIGKILL (it dies with the
//! experiment, even if the experiment is killed with SIGKILL) and recorded in [`Procs`],
//! which stops what is left (SIGTERM, SIGKILL after 2 s) when dropped.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use ictus_bench::experiment::Role;
use ictus_bench::sys::GuardedCommand;
use ictus_bench::BenchError;
use rustix::process::Signal;

use crate::bench::rig::{err, nap};
use crate::{EngineConfig, StartOptions};

/// A stream node: `CONF POOL DIRECTOR ID CAPACITY CACHE AHEAD BUFFERS LISTEN_IP KEY_FILE`.
pub static NODE_ROLE: Role = Role { name: "mars-cluster-node", run: node_main };

/// How a node is started.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// The cluster's configuration file.
    pub conf: PathBuf,
    /// The pool of the clips.
    pub pool: String,
    /// The director's nodes' port.
    pub director: SocketAddr,
    /// The engine's capability (bytes/s); the director is told the real-time share of
    /// it, what the engine admits for paced streams.
    pub capacity: u64,
    /// Its stripe cache.
    pub cache: u64,
    /// Read ahead of each stream.
    pub ahead: u64,
    /// The engine's buffers ([`EngineConfig::buffers`]): enough for the read-ahead
    /// floors of the streams its capacity admits ([`buffers_for`]).
    pub buffers: usize,
    /// The cluster key's file ([`cluster_key`]): the node registers with it.
    pub key: PathBuf,
}

/// The experiment's cluster key file in `dir` (its nodes' [`NodeSpec::key`]).
pub fn key_file(dir: &Path) -> PathBuf {
    dir.join("cluster.key")
}

/// A new cluster key in [`key_file`] (mode 0600, as a deployment's would be), for the
/// director in this process; the nodes read the file.
pub fn cluster_key(dir: &Path) -> Result<ictus_mars_cluster::ClusterKey, BenchError> {
    let path = key_file(dir);
    // A key of an earlier director (or run) in the same directory is not reused.
    let _ = fs::remove_file(&path);
    ictus_mars_cluster::ClusterKey::create(&path).map_err(|e| err("cluster key", e))
}

/// Engine buffers a node needs so that its pool admits `streams` paced streams at
/// `rate` (each holds its read-ahead floor; the engine keeps `rt_buffers` and a
/// download's window spare): never fewer than the default.
///
/// *Why*: with the default 256 buffers of 256 KiB, a node's engine refuses the 48th
/// stream at 2 MB/s (47 × 5 floor buffers + 20 spare ≤ 256), below the capacity the
/// node tells the director; the 1-node side of the capacity search saw 47 of 48 streams
/// get a node.
pub fn buffers_for(streams: usize, rate: u64) -> usize {
    let e = EngineConfig::default();
    let floor = e.readahead.floor_window(rate as f64, e.buf_size as u64);
    (streams * floor + e.rt_buffers + e.window).max(e.buffers)
}

fn node_main(args: &[String]) -> i32 {
    let [conf, pool, director, id, cap, cache, ahead, buffers, listen, key] = args else {
        eprintln!("mars-cluster-node: expected CONF POOL DIRECTOR ID CAPACITY CACHE AHEAD BUFFERS LISTEN_IP KEY_FILE");
        return 2;
    };
    let key = match ictus_mars_cluster::ClusterKey::load(Path::new(key)) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("mars-cluster-node: {e}");
            return 2;
        }
    };
    let (Ok(director), Ok(id), Ok(cap), Ok(cache), Ok(ahead), Ok(buffers), Ok(listen)) = (
        director.parse::<SocketAddr>(),
        id.parse::<u32>(),
        cap.parse::<u64>(),
        cache.parse::<u64>(),
        ahead.parse::<u64>(),
        buffers.parse::<usize>(),
        listen.parse::<std::net::Ipv4Addr>(),
    ) else {
        eprintln!("mars-cluster-node: bad arguments {args:?}");
        return 2;
    };
    crate::cli::raise_nofile();
    let mut c = crate::ceph::CephOptions::new(PathBuf::from(conf), pool.clone());
    c.cache_bytes = cache;
    c.ahead = ahead;
    let opts = StartOptions {
        volume: Vec::new(),
        listen: Some(format!("{listen}:0")),
        capability: Some(cap as f64),
        // Timesharing, as nginx runs: the comparison is of designs, not of priorities.
        engine: EngineConfig { fifo: None, buffers: buffers.clamp(1, 1 << 16), ..EngineConfig::default() },
        force_fallback: false,
    };
    let (running, ceph) = match crate::start_cluster(&c, &opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mars-cluster-node {id}: {e}");
            return 1;
        }
    };
    let Some(http) = running.addr else { return 1 };
    let handle = running.handle.clone();
    // What the director may place here: what the engine admits for paced streams (the
    // smallest of its limits).
    let admits = crate::engine::paced_capacity(&opts.engine, running.capability);
    // Runs until the experiment stops it (SIGTERM) or kills it (SIGKILL).
    let stop = AtomicBool::new(false);
    ictus_mars_cluster::service::node_agent(
        &ictus_mars_cluster::service::NodeIdentity { director, id, http, capacity: admits, key },
        Duration::from_millis(100),
        || crate::cli::node_report(handle.as_ref(), Some(&ceph)),
        &stop,
    );
    0
}

/// A network namespace's name and the address of the node in it.
pub type Place = (String, std::net::Ipv4Addr);

/// Children, stopped when dropped.
#[derive(Debug, Default)]
pub struct Procs {
    children: Vec<(String, Child)>,
}

impl Procs {
    /// Starts node `id`, in network namespace `place` (its name and the node's address)
    /// if given, else on the host's loopback; its standard error goes to `log`
    /// (appended).
    pub fn node(&mut self, spec: &NodeSpec, id: u32, place: Option<&Place>, log: &Path) -> Result<(), BenchError> {
        let args = [
            spec.conf.display().to_string(),
            spec.pool.clone(),
            spec.director.to_string(),
            id.to_string(),
            spec.capacity.to_string(),
            spec.cache.to_string(),
            spec.ahead.to_string(),
            spec.buffers.to_string(),
            place.map_or("127.0.0.1".to_string(), |p| p.1.to_string()),
            spec.key.display().to_string(),
        ];
        let mut cmd = match place {
            None => ictus_bench::child::child_command(&NODE_ROLE, &args, &[]).map_err(|e| err("node", e))?,
            Some((ns, _)) => {
                // `ip netns exec` enters the namespace and execs the node (same pid, so
                // the death signal holds).
                let exe = std::env::current_exe().map_err(|e| err("node", e))?;
                let mut c = GuardedCommand::new("ip", Signal::KILL).check_parent();
                c.command()
                    .args(["netns", "exec", ns])
                    .arg(exe)
                    .arg(ictus_bench::child::CHILD_FLAG)
                    .arg(NODE_ROLE.name)
                    .args(&args);
                c
            }
        };
        let log = fs::OpenOptions::new().create(true).append(true).open(log).map_err(|e| err("node log", e))?;
        cmd.command().stdout(Stdio::null()).stderr(log);
        let child = cmd.spawn().map_err(|e| err("starting a node", e))?;
        self.children.push((format!("node {id}"), child));
        Ok(())
    }

    /// Starts nginx with `conf` (its `-p` prefix `dir`), recorded as `name`, in
    /// network namespace `ns` if given.
    pub fn nginx(&mut self, name: &str, dir: &Path, conf: &Path, ns: Option<&str>) -> Result<(), BenchError> {
        self.nginx_as(name, name, dir, conf, ns)
    }

    /// As [`Procs::nginx`], recorded as `label` (several processes of one server, such
    /// as the front's workers, share a label: [`Procs::stop`] stops them all); `name`
    /// names its files.
    pub fn nginx_as(
        &mut self,
        label: &str,
        name: &str,
        dir: &Path,
        conf: &Path,
        ns: Option<&str>,
    ) -> Result<(), BenchError> {
        let mut cmd = match ns {
            None => GuardedCommand::new("nginx", Signal::KILL).check_parent(),
            Some(ns) => {
                let mut c = GuardedCommand::new("ip", Signal::KILL).check_parent();
                c.command().args(["netns", "exec", ns, "nginx"]);
                c
            }
        };
        cmd.command().arg("-p").arg(dir).arg("-c").arg(conf).arg("-e").arg(dir.join(format!("{name}.err")));
        cmd.command().stdout(Stdio::null()).stderr(Stdio::null());
        let child = cmd.spawn().map_err(|e| err("starting nginx", e))?;
        self.children.push((label.to_string(), child));
        Ok(())
    }

    /// CPU time (user + system, ns) the children whose label starts with `prefix` have
    /// used so far (their `/proc/PID/stat`; 0 for any that cannot be read).
    pub fn cpu_ns(&self, prefix: &str) -> u64 {
        self.children.iter().filter(|(n, _)| n.starts_with(prefix)).map(|(_, c)| cpu_ns_of(&c.id().to_string())).sum()
    }

    /// TCP segments retransmitted so far in the network namespaces of the children
    /// whose label starts with `prefix` (each namespace once) and in this process's.
    pub fn tcp_retransmits(&self, prefix: &str) -> u64 {
        let mut seen = std::collections::HashSet::new();
        let mut total = 0;
        let pids = self.children.iter().filter(|(n, _)| n.starts_with(prefix)).map(|(_, c)| c.id());
        for pid in pids.chain([std::process::id()]) {
            let Ok(ns) = fs::read_link(format!("/proc/{pid}/ns/net")) else { continue };
            if seen.insert(ns) {
                total += fs::read_to_string(format!("/proc/{pid}/net/snmp"))
                    .ok()
                    .and_then(|t| retrans_segs(&t))
                    .unwrap_or(0);
            }
        }
        total
    }

    /// Kills `name` with SIGKILL (a failure) and reaps it.
    pub fn kill9(&mut self, name: &str) {
        if let Some(i) = self.children.iter().position(|(n, _)| n == name) {
            let (_, mut c) = self.children.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops `name` (SIGTERM, SIGKILL after 2 s).
    pub fn stop(&mut self, name: &str) {
        let (mine, rest): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.children).into_iter().partition(|(n, _)| n == name);
        self.children = rest;
        stop_all(mine);
    }

    /// Whether `name` exited (and why), reaping it.
    pub fn exited(&mut self, name: &str) -> Option<String> {
        let i = self.children.iter().position(|(n, _)| n == name)?;
        match self.children[i].1.try_wait() {
            Ok(Some(st)) => {
                self.children.remove(i);
                Some(st.to_string())
            }
            _ => None,
        }
    }
}

fn stop_all(children: Vec<(String, Child)>) {
    let mut children: Vec<Child> = children.into_iter().map(|(_, c)| c).collect();
    crate::bench::rig::stop_children(&mut children);
}

impl Drop for Procs {
    fn drop(&mut self) {
        stop_all(std::mem::take(&mut self.children));
    }
}

/// Writes an nginx configuration: one process (`master_process off`), sendfile on,
/// with `body` (its `server` blocks, an `upstream`) inside `http`.
pub fn nginx_conf(dir: &Path, name: &str, body: &str) -> Result<PathBuf, BenchError> {
    let tmp = dir.join(format!("{name}-tmp"));
    fs::create_dir_all(&tmp).map_err(|e| err("nginx dir", e))?;
    let text = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/{name}.pid;\nerror_log {d}/{name}.err warn;\n\
         events {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  \
         client_body_temp_path {t}/body;\n  proxy_temp_path {t}/proxy;\n  fastcgi_temp_path {t}/fcgi;\n  uwsgi_temp_path {t}/uwsgi;\n  \
         scgi_temp_path {t}/scgi;\n  {body}\n}}\n",
        d = dir.display(),
        t = tmp.display(),
    );
    let conf = dir.join(format!("{name}.conf"));
    fs::write(&conf, text).map_err(|e| err("nginx conf", e))?;
    Ok(conf)
}

/// Waits until `port` answers `/probe` with `X-Node: id` (a node) or at all (the
/// front), for at most 10 s; else the end of its error log (`dir/name.err`).
pub fn wait_nginx(dir: &Path, name: &str, addr: SocketAddr, probe: &str, node: Option<u32>) -> Result<(), BenchError> {
    let port = addr.port();
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(head) = small_get(addr, probe) {
            let ok = head.starts_with("HTTP/1.1 200")
                && node.map_or(true, |n| head.to_ascii_lowercase().contains(&format!("\r\nx-node: {n}\r\n")));
            if ok {
                return Ok(());
            }
        }
        if Instant::now() > end {
            let log = fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(3).collect();
            return Err(err(
                "nginx",
                format!("{name} on port {port} does not answer as the nginx this run started: {}", tail.join(" / ")),
            ));
        }
        nap(Duration::from_millis(20))?;
    }
}

fn small_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET /{path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n").ok()?;
    let mut all = Vec::new();
    s.read_to_end(&mut all).ok()?;
    Some(String::from_utf8_lossy(&all).into_owned())
}

/// `RetransSegs` of the `Tcp:` lines of a `/proc/net/snmp`.
fn retrans_segs(snmp: &str) -> Option<u64> {
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let i = names.split_whitespace().position(|n| n == "RetransSegs")?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// Packets the kernel dropped from its per-CPU input backlogs so far (the second
/// column of `/proc/net/softnet_stat`, all namespaces).
pub fn backlog_drops() -> u64 {
    fs::read_to_string("/proc/net/softnet_stat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
        .sum()
}

/// CPU time (user + system, ns, every thread) process `pid` (a number, or `self`) has
/// used so far, from `/proc/PID/stat`; 0 if it cannot be read.
pub fn cpu_ns_of(pid: &str) -> u64 {
    let tick = rustix::param::clock_ticks_per_second().max(1);
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0 };
    // Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
    let ticks = (|| {
        let rest = &stat[stat.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
    })();
    ticks.unwrap_or(0) * (1_000_000_000 / tick)
}

/// The machine's busy CPU time so far (ns, every core, every process: `/proc/stat`'s
/// total less idle and iowait); 0 if it cannot be read.
pub fn machine_busy_ns() -> u64 {
    let tick = rustix::param::clock_ticks_per_second().max(1);
    let Ok(stat) = fs::read_to_string("/proc/stat") else { return 0 };
    let Some(line) = stat.lines().next() else { return 0 };
    let f: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is counted in user).
    let busy: u64 =
        f.iter().take(8).sum::<u64>().saturating_sub(f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0));
    busy * (1_000_000_000 / tick)
}

#[cfg(test)]
mod tests {
    #[test]
    fn retransmissions_are_read_from_the_tcp_lines() {
        let snmp =
            "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin RetransSegs InErrs\nTcp: 1 200 17 0\n";
        assert_eq!(super::retrans_segs(snmp), Some(17));
        assert_eq!(super::retrans_segs("Tcp: A B\n"), None);
    }

    use super::{buffers_for, EngineConfig};

    /// The engine's own admission rule (`Engine::make_paced`): the floors of the paced
    /// streams and the spare buffers fit the pool.
    fn pool_admits(buffers: usize, streams: usize, rate: u64) -> bool {
        let e = EngineConfig::default();
        streams * e.readahead.floor_window(rate as f64, e.buf_size as u64) + e.rt_buffers + e.window <= buffers
    }

    #[test]
    fn a_nodes_pool_holds_the_streams_its_capacity_admits() {
        let default = EngineConfig::default().buffers;
        // What the 1-node side of the quick search ran into.
        assert!(!pool_admits(default, 48, 2_000_000), "the default pool refuses the 48th 2 MB/s stream");
        for rate in [250_000, 2_000_000, 3_000_000, 40_000_000] {
            for streams in [1, 47, 48, 128, 192] {
                let b = buffers_for(streams, rate);
                assert!(pool_admits(b, streams, rate), "{streams} streams at {rate} B/s: {b} buffers");
                assert!(b >= default);
            }
        }
        assert_eq!(buffers_for(1, 2_000_000), default, "small nodes keep the default pool");
    }
}
