//! Each stream node in its own network namespace, as if on its own machine: a Linux
//! bridge in this (the host's) namespace holds the address the Ceph daemons, the
//! director and nginx's front listen on; each node's namespace has one end of a veth
//! pair (the other end on the bridge) with the node's own address, and its own
//! loopback. Players in the host's namespace reach the nodes over the bridge, the nodes
//! reach Ceph and the director at the bridge's address.
//!
//! Made with iproute2 (`ip link`, `ip netns`), which needs `CAP_NET_ADMIN`; without it
//! (or without `ip`), [`Net::make`] says why and the nodes run in the host's namespace
//! on the loopback. Torn down on drop (deleting a namespace deletes its veth pair);
//! names carry the pid, so a run killed with SIGKILL is swept by the next
//! ([`sweep_stale`]).
//!
//! **Links** ([`Net::shape`]): each node's veth gets a fixed rate in both directions, its
//! NIC — a token bucket (`tc` `tbf`) as the root qdisc of each end (the node's end
//! shapes what the node sends, the bridge's end what it receives: Ceph's reads, the
//! requests). `tbf` and not `htb`: a link is one rate with no classes to share it, which
//! is what the classless `tbf` is; `htb` would be the same bucket under a class tree.
//! The qdiscs belong to the veth's two ends, so they go with the pair when the
//! namespace is deleted — by [`Drop`], or by the next run's [`sweep_stale`] after a
//! SIGKILL: nothing of them outlives the namespaces.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

/// The namespaces, veths and bridge of a run.
#[derive(Debug)]
pub struct Net {
    bridge: String,
    /// The bridge's address (the host's side).
    pub host: Ipv4Addr,
    namespaces: Vec<String>,
    /// Each node's veth: (namespace, the bridge's end, the node's end).
    veths: Vec<(String, String, String)>,
    prefix: [u8; 3],
    /// The links' rate (bits/s) if shaped.
    rate: Option<u64>,
}

/// A link's token bucket: `tc qdisc replace` arguments for `rate` bits/s. The burst
/// holds 4 ms at the rate and at least two 64 KiB segments (veths pass GSO segments of
/// up to 64 KiB whole; a bucket smaller than one would split each); the queue holds
/// 50 ms at the rate beyond the burst (TCP's small-queue limit keeps each socket's
/// share of it small, as a NIC's ring does).
pub fn tbf_args(rate: u64) -> Vec<String> {
    let burst = (rate / 8 / 250).max(128 << 10);
    vec![
        "root".into(),
        "tbf".into(),
        "rate".into(),
        format!("{rate}bit"),
        "burst".into(),
        format!("{burst}b"),
        "latency".into(),
        "50ms".into(),
    ]
}

fn tc(netns: Option<&str>, args: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new("tc");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    let out = cmd.args(args).output().map_err(|e| format!("tc: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("tc {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

const NS_PREFIX: &str = "ictus-mc-";
const BR_PREFIX: &str = "icmc";

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl Net {
    /// A bridge with a /24 of its own, or why not.
    pub fn make() -> Result<Net, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("not root: network namespaces and veths need CAP_NET_ADMIN".into());
        }
        let pid = std::process::id();
        // A /24 in 10.213.0.0/16 picked by the pid, unless an interface has it already.
        let used = Command::new("ip")
            .args(["-4", "-o", "addr"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .map_err(|e| format!("ip: {e}"))?;
        let third = (0..256u32)
            .map(|i| ((pid + i) % 250 + 1) as u8)
            .find(|t| !used.contains(&format!("10.213.{t}.")))
            .ok_or("no free /24 in 10.213.0.0/16")?;
        let prefix = [10, 213, third];
        let net = Net {
            bridge: format!("{BR_PREFIX}{pid}"),
            host: Ipv4Addr::new(10, 213, third, 1),
            namespaces: Vec::new(),
            veths: Vec::new(),
            prefix,
            rate: None,
        };
        ip(&["link", "add", &net.bridge, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{}/24", net.host), "dev", &net.bridge])?;
        ip(&["link", "set", &net.bridge, "up"])?;
        Ok(net)
    }

    /// The namespace of node `id` (1 to 200), made on first use; its name and address.
    pub fn node(&mut self, id: u32) -> Result<(String, Ipv4Addr), String> {
        let pid = std::process::id();
        let name = format!("{NS_PREFIX}{pid}-{id}");
        let addr = Ipv4Addr::new(self.prefix[0], self.prefix[1], self.prefix[2], 10 + id as u8);
        if self.namespaces.contains(&name) {
            return Ok((name, addr));
        }
        if id == 0 || id > 200 {
            return Err(format!("node {id}: 1 to 200"));
        }
        ip(&["netns", "add", &name])?;
        self.namespaces.push(name.clone());
        let (outer, inner) = (format!("icv{pid}n{id}"), format!("icw{pid}n{id}"));
        ip(&["link", "add", &outer, "type", "veth", "peer", "name", &inner])?;
        let made = (|| {
            ip(&["link", "set", &inner, "netns", &name])?;
            ip(&["link", "set", &outer, "master", &self.bridge])?;
            ip(&["link", "set", &outer, "up"])?;
            ip(&["-n", &name, "addr", "add", &format!("{addr}/24"), "dev", &inner])?;
            ip(&["-n", &name, "link", "set", &inner, "up"])?;
            ip(&["-n", &name, "link", "set", "lo", "up"])
        })();
        if let Err(e) = made {
            let _ = ip(&["link", "del", &outer]);
            return Err(e);
        }
        self.veths.push((name.clone(), outer, inner));
        if let Some(rate) = self.rate {
            self.shape_one(self.veths.len() - 1, Some(rate))?;
        }
        Ok((name, addr))
    }

    /// Every node's link (made so far, and those made later) at `rate` bits/s each way,
    /// or unshaped (`None`: as fast as the veth, i.e. memory); or why not (no `tc`, no
    /// `tbf` in the kernel).
    pub fn shape(&mut self, rate: Option<u64>) -> Result<(), String> {
        for i in 0..self.veths.len() {
            self.shape_one(i, rate)?;
        }
        self.rate = rate;
        Ok(())
    }

    /// The links' rate (bits/s), if shaped.
    pub fn rate(&self) -> Option<u64> {
        self.rate
    }

    fn shape_one(&self, i: usize, rate: Option<u64>) -> Result<(), String> {
        let (ns, outer, inner) = &self.veths[i];
        match rate {
            Some(r) => {
                let q = tbf_args(r);
                let q: Vec<&str> = q.iter().map(String::as_str).collect();
                tc(None, &[&["qdisc", "replace", "dev", outer.as_str()], &q[..]].concat())?;
                tc(Some(ns), &[&["qdisc", "replace", "dev", inner.as_str()], &q[..]].concat())
            }
            None => {
                // Back to the veth's default (no queue): deleting a root qdisc that is
                // the default already fails, which is the state wanted.
                let _ = tc(None, &["qdisc", "del", "dev", outer, "root"]);
                let _ = tc(Some(ns), &["qdisc", "del", "dev", inner, "root"]);
                Ok(())
            }
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.namespaces.drain(..) {
            let _ = ip(&["netns", "del", &ns]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// Removes the namespaces and bridges of runs whose process is gone.
pub fn sweep_stale() {
    let dead = |pid: &str| {
        pid.parse::<u32>().is_ok_and(|p| p != std::process::id() && !Path::new(&format!("/proc/{p}")).exists())
    };
    if let Ok(rd) = std::fs::read_dir("/run/netns") {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = n.strip_prefix(NS_PREFIX).and_then(|r| r.split('-').next()) {
                if dead(pid) {
                    let _ = ip(&["netns", "del", &n]);
                }
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir("/sys/class/net") {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.strip_prefix(BR_PREFIX).is_some_and(dead) {
                let _ = ip(&["link", "del", &n]);
            }
        }
    }
}

/// What this process made and has not removed: empty after a clean teardown.
pub fn leftovers() -> Vec<String> {
    let pid = std::process::id();
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/run/netns") {
        out.extend(
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{NS_PREFIX}{pid}-"))),
        );
    }
    if Path::new(&format!("/sys/class/net/{BR_PREFIX}{pid}")).exists() {
        out.push(format!("{BR_PREFIX}{pid}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::tbf_args;

    fn burst(rate: u64) -> u64 {
        let a = tbf_args(rate);
        let i = a.iter().position(|x| x == "burst").unwrap();
        a[i + 1].trim_end_matches('b').parse().unwrap()
    }

    #[test]
    fn a_links_bucket_holds_two_segments_and_4_ms() {
        for rate in [10_000_000u64, 320_000_000, 1_000_000_000, 10_000_000_000] {
            let b = burst(rate);
            assert!(b >= 2 * (64 << 10), "{rate}: {b}");
            assert!(b * 8 * 250 >= rate, "{rate}: {b}");
            assert!(tbf_args(rate).contains(&format!("{rate}bit")));
        }
    }
}
