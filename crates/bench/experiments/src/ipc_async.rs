//! The `ipc` experiment's async case: a port round trip made with the async API
//! (`ictus_ipc::aio`, feature `tokio`) at both ends, beside the same round trip made with
//! the blocking API (`port inline`), interleaved in the same lanes.
//!
//! - The client runs a tokio current-thread runtime in this process and calls with an
//!   [`AsyncCaller`]: the request goes out without blocking, and the reply is awaited
//!   on the call channel's pipe through the runtime's epoll.
//! - The server (role `port-async-echo`) runs a current-thread runtime in its own
//!   process: an [`AsyncReceiver`] on its service port, each request answered through its
//!   reply right with [`REPLY_LEN`] bytes, touching every page it received, as
//!   `port-echo` does for the blocking case.
//!
//! Headline `ipc_async_rtt_vs_blocking`: p50 at 64 B, async over blocking (target ≤ 1.3).
//! What the ratio pays for is in `doc/async.md`: a runtime turn on each side, and a
//! receive tried once more after each message (the runtime's readiness is edge-triggered,
//! so a receiver must see the queue empty before it waits).

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::process::Child;
use std::time::{Duration, Instant};

use ictus_bench::child::{fd_arg, reap, role_status, spawn_child};
use ictus_bench::{Role, Transport};
use ictus_ipc::aio::{AsyncCaller, AsyncReceiver};
use ictus_ipc::{Disposition, Message, Name, PortArg, ReceiveOptions, Received, RightKind, SendOptions, Space};

use crate::peers::REPLY_LEN;

/// The async transport's name, as rows and headlines spell it.
pub const PORT_ASYNC: &str = "port async";

/// The headline: the async round trip over the blocking one, at this size.
pub const HEADLINE: &str = "ipc_async_rtt_vs_blocking";
/// The size the headline compares at.
pub const HEADLINE_SIZE: usize = 64;
/// Its target.
pub const TARGET: f64 = 1.3;

const SETUP: i32 = 1;
const REQUEST: i32 = 2;
const STOP: i32 = 4;
const WATCHDOG: Duration = Duration::from_secs(60);
const PAGE: usize = 4096;

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}

/// The async client and its server process.
#[derive(Debug)]
pub struct AsyncPortTransport {
    space: Space,
    service: Name,
    runtime: tokio::runtime::Runtime,
    caller: Option<AsyncCaller>,
    received: Received,
    child: Child,
}

impl AsyncPortTransport {
    /// Spawn the server and connect to it.
    pub fn spawn() -> io::Result<AsyncPortTransport> {
        let space = Space::new();
        let setup = space.allocate_port().map_err(other)?;
        let fd = space.send_right_fd(setup).map_err(other)?;
        let child = spawn_child(&ROLE, &[fd.as_fd().as_raw_fd().to_string()], &[fd.as_fd()])?;
        drop(fd);
        let mut received = Received::new();
        let opts = ReceiveOptions { timeout: Some(WATCHDOG), populate_ool: false };
        space.receive(setup, &mut received, opts).map_err(other)?;
        if received.id != SETUP || received.ports.len() != 1 {
            return Err(other("async port server sent an unexpected set-up message"));
        }
        let service = received.ports[0].name;
        space.destroy(setup).map_err(other)?;
        let runtime = runtime()?;
        let caller = runtime.block_on(async { AsyncCaller::new(&space, service) }).map_err(other)?;
        Ok(AsyncPortTransport { space, service, runtime, caller: Some(caller), received, child })
    }
}

impl Transport for AsyncPortTransport {
    fn name(&self) -> &str {
        PORT_ASYNC
    }

    fn server_pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn description(&self) -> &str {
        "ictus port call with the async API at both ends (tokio current-thread runtimes, AsyncFd)"
    }

    fn round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>> {
        let caller = self.caller.as_mut().ok_or_else(|| other("no caller"))?;
        let received = &mut self.received;
        self.runtime.block_on(async {
            let mut times = Vec::with_capacity(iters);
            let mut msg = Message::new(REQUEST, vec![0xa5; size]);
            for _ in 0..iters {
                let t0 = Instant::now();
                caller.call(&mut msg, received, None).await.map_err(other)?;
                times.push(t0.elapsed().as_nanos() as u64);
            }
            Ok(times)
        })
    }
}

impl Drop for AsyncPortTransport {
    fn drop(&mut self) {
        // The caller's registrations belong to the runtime: drop it inside.
        if let Some(c) = self.caller.take() {
            let _guard = self.runtime.enter();
            drop(c);
        }
        let _ = self.space.send(self.service, &mut Message::new(STOP, Vec::new()), SendOptions::NONBLOCKING);
        let _ = self.space.destroy(self.service);
        reap(&mut self.child, Duration::from_secs(5));
    }
}

/// The server end of the async transport.
pub static ROLE: Role = Role { name: "port-async-echo", run: async_server };

/// The `port-async-echo` role.
pub fn async_server(args: &[String]) -> i32 {
    role_status("port-async-echo", serve(args))
}

fn touch(data: &[u8]) -> u64 {
    let mut sum = 0u64;
    let mut i = 0;
    while i < data.len() {
        sum = sum.wrapping_add(u64::from(data[i]));
        i += PAGE;
    }
    sum.wrapping_add(data.last().copied().map_or(0, u64::from))
}

fn serve(args: &[String]) -> io::Result<()> {
    let fd = fd_arg(args.first().ok_or_else(|| other("missing descriptor argument"))?)?;
    let space = Space::new();
    let setup = space.insert_send_fd(fd).map_err(other)?;
    let service = space.allocate_port().map_err(other)?;
    let mut m = Message::new(SETUP, Vec::new());
    m.ports.push(PortArg::new(service, Disposition::MakeSend));
    space.send(setup, &mut m, SendOptions::default()).map_err(other)?;
    space.deallocate(setup).map_err(other)?;
    runtime()?.block_on(async {
        let requests = AsyncReceiver::new(&space, service).map_err(other)?;
        let mut r = Received::new();
        let mut reply = Message::new(REQUEST + 100, vec![0u8; REPLY_LEN]);
        let mut sink = 0u64;
        loop {
            match requests.receive(&mut r).await {
                Ok(()) => {}
                Err(ictus_ipc::ReceiveError::Malformed { .. }) => continue,
                Err(e) => return Err(other(e)),
            }
            match r.id {
                REQUEST => {
                    sink = sink.wrapping_add(touch(r.data()));
                    let Some(to) = r.reply.take() else { continue };
                    ictus_ipc::aio::send(&space, to.name, &mut reply, Some(WATCHDOG)).await.map_err(other)?;
                    if to.kind != RightKind::SendOnce {
                        let _ = space.deallocate(to.name);
                    }
                }
                STOP => break,
                _ => {}
            }
        }
        std::hint::black_box(sink);
        Ok(())
    })
}

/// The headline [`HEADLINE`]: the async round trip's p50 at [`HEADLINE_SIZE`] over the
/// blocking transport `blocking`'s, measured in the same lanes. Each round of the lanes
/// is a window holding one batch of each, side by side; the headline takes each side's
/// median of its per-window p50s and their ratio (`ictus_bench::windows::Windowed`), and a row per window
/// shows the spread. Missing either, a note says why.
pub fn add_headline(report: &mut ictus_bench::Report, measured: &[ictus_bench::rounds::Lane], blocking: &str) {
    let peer = measured.iter().find(|m| m.name == blocking);
    let ours = measured.iter().find(|m| m.name == PORT_ASYNC);
    let windows = crate::ipc::p50_windows(ours, peer, HEADLINE_SIZE).zip(peer);
    match windows {
        Some((w, peer)) => {
            report.headline.push(
                ictus_bench::Headline::new(
                    HEADLINE,
                    w.ours,
                    w.peer,
                    format!("{} (the blocking API at both ends)", peer.description),
                    "ns",
                    ictus_bench::Better::Lower,
                )
                .with_target(TARGET),
            );
            report.rows.extend(w.rows(&format!("{PORT_ASYNC} vs {blocking} 64 B p50"), "ns"));
        }
        None => report.notes.push(format!(
            "headline {HEADLINE} omitted: needs p50s of {PORT_ASYNC:?} and {blocking:?} at {}",
            ictus_bench::format_size(HEADLINE_SIZE)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ictus_bench::rounds::Lane;
    use ictus_bench::{Conditions, Report};

    fn lane(name: &str, round_p50s: &[f64]) -> Lane {
        let mut m = Lane::new(name, format!("{name} description"), crate::ipc::SIZES.len());
        for (r, p) in m.cases.iter_mut().zip(&mut m.round_p50s) {
            for &x in round_p50s {
                r.record_all(&[x as u64; 3]);
                p.push(x);
            }
        }
        m
    }

    #[test]
    fn the_headline_is_async_over_blocking_at_64_bytes() {
        let mut report = Report::new("ipc", "000 §8, Figure 3", true, Conditions::capture_before());
        add_headline(&mut report, &[lane("port inline", &[8_000.0]), lane(PORT_ASYNC, &[9_600.0])], "port inline");
        assert_eq!(report.headline.len(), 1);
        let h = &report.headline[0];
        assert_eq!(h.name, HEADLINE);
        assert!((h.ratio - 1.2).abs() < 0.01, "{}", h.ratio);
        assert_eq!(h.met, Some(true));
        assert!(h.peer_name.starts_with("port inline description"), "{}", h.peer_name);
    }

    #[test]
    fn the_headline_is_the_ratio_of_each_sides_median_window() {
        // Window 2 of the blocking side and window 4 of the async side were hit by a
        // stall; the medians (9.6 and 8.0 µs) are not.
        let blocking = lane("port inline", &[8_000.0, 30_000.0, 7_900.0, 8_100.0, 8_000.0]);
        let ours = lane(PORT_ASYNC, &[9_600.0, 9_500.0, 9_700.0, 40_000.0, 9_600.0]);
        let mut report = Report::new("ipc", "000 §8, Figure 3", true, Conditions::capture_before());
        add_headline(&mut report, &[blocking, ours], "port inline");
        let h = &report.headline[0];
        assert_eq!((h.ours, h.peer), (9_600.0, 8_000.0));
        assert_eq!(report.rows.len(), 6, "a row per window, then the median");
        assert_eq!(report.rows[1]["ratio"], 0.317);
        assert_eq!(report.rows[5]["case"], "port async vs port inline 64 B p50: median of 5 windows");
    }

    #[test]
    fn without_the_async_lane_a_note_says_why() {
        let mut report = Report::new("ipc", "000 §8, Figure 3", true, Conditions::capture_before());
        add_headline(&mut report, &[lane("port inline", &[8_000.0])], "port inline");
        assert!(report.headline.is_empty());
        assert!(report.notes[0].contains(HEADLINE), "{:?}", report.notes);
    }
}
