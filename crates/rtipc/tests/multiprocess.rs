//! Real-time ports between processes: the priority-inversion test of the issue, crash
//! tests (`kill -9` of a client that a server inherits from — serving a port or a port
//! set — and of a server a client inherits into), and the unprivileged path.
//!
//! Own `main` (harness = false): the test re-executes itself as the server, the
//! clients, and an unprivileged child. Scenarios that need `SCHED_FIFO` print why they
//! are skipped when the kernel refuses it. Every wait has a generous watchdog; nothing
//! asserts a duration, only the order of events.
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ictus_ipc::{Disposition, Message, Name, PortArg, ReceiveOptions, Received, SendOptions as IpcSend, Space};
use ictus_rt::thread::Policy;
use ictus_rtipc::sys::{effective_priority, pin_current_thread, set_current_policy};
use ictus_rtipc::{Handoff, PortAttrs, Queueing, RtSpace, SendError, SendOptions};

const ROLE: &str = "RTIPC_TEST_ROLE";
const WATCHDOG: Duration = Duration::from_secs(60);
const SERVER_PRIO: u8 = 10;
const HOG_PRIO: u8 = 20;
const CLIENT_PRIO: u8 = 30;

fn attrs_named(label: &str) -> PortAttrs {
    let (q, h) = label.split_once('/').expect("Q/H");
    let q = match q {
        "FIFO" => Queueing::Fifo,
        "PRIO" => Queueing::Priority,
        _ => Queueing::PriorityInheritance,
    };
    let h = match h {
        "OFF" => Handoff::Off,
        "MSG" => Handoff::Message,
        _ => Handoff::Sender,
    };
    PortAttrs::new(q, h)
}

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        let code = match role.as_str() {
            "server" => server_role(),
            "client" => client_role(),
            "unprivileged" => unprivileged_role(),
            "sender" => sender_role(),
            other => {
                eprintln!("unknown role {other}");
                2
            }
        };
        std::process::exit(code);
    }
    let args: Vec<String> = std::env::args().collect();
    let tests: [(&str, TestFn); 8] = [
        ("requests_of_a_client_killed_after_sending_are_delivered", || killed_sender_test("FIFO/OFF")),
        ("requests_of_a_killed_client_are_delivered_in_priority_order", || killed_sender_test("BPI/ON")),
        ("inversion_is_bounded_by_handoff_and_inheritance", inversion_test),
        ("killed_client_leaves_no_boost_and_no_buffer", || killed_client_test(false)),
        ("killed_client_of_a_set_member_leaves_no_boost_and_no_buffer", || killed_client_test(true)),
        ("killed_server_releases_waiting_client", killed_server_test),
        ("unprivileged_ports_still_work_as_fifo_without_handoff", unprivileged_test),
        ("plain_port_in_another_task_is_an_invalid_destination", remote_plain_port_test),
    ];
    if args.iter().any(|a| a == "--list") {
        for (name, _) in tests {
            println!("{name}: test");
        }
        return;
    }
    let filter = args.iter().skip(1).find(|a| !a.starts_with('-')).cloned();
    let mut failed = 0;
    for (name, test) in tests {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        match test() {
            Ok(()) => println!("test {name} ... ok"),
            Err(e) => {
                println!("test {name} ... FAILED: {e}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        std::process::exit(1);
    }
}

type TestFn = fn() -> Result<(), String>;

/// A child process killed and reaped when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rt_ok() -> bool {
    ictus_rt::thread::rt_privileges()
}

/// Spawns this binary in `role`, killed if we die, with `bootstrap` as its bootstrap right.
fn spawn(space: &Space, role: &str, bootstrap: Name, env: &[(&str, String)]) -> Reaped {
    let mut cmd = Command::new(std::env::current_exe().expect("exe"));
    cmd.env(ROLE, role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    space.give_bootstrap(&mut cmd, bootstrap).expect("bootstrap");
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    Reaped(cmd.spawn().expect("spawn"))
}

struct Server {
    child: Reaped,
    rt: RtSpace,
    port: Name,
    pid: u32,
    tid: u32,
}

/// Starts a server process (pinned to CPU 0, `SCHED_FIFO SERVER_PRIO` when permitted)
/// owning a real-time port with `label`'s policies; returns its port, here.
fn start_server(label: &str) -> Result<Server, String> {
    start_server_in(label, false)
}

/// As `start_server`; with `in_set` the server puts the port in a real-time port set and
/// receives through the set.
fn start_server_in(label: &str, in_set: bool) -> Result<Server, String> {
    let space = Space::new();
    let rt = RtSpace::new(space.clone());
    let back = space.allocate_port_with_send().map_err(|e| e.to_string())?;
    let set = if in_set { "1" } else { "0" }.to_string();
    let child = spawn(&space, "server", back, &[("RTIPC_ATTRS", label.to_string()), ("RTIPC_SET", set)]);
    let mut m = Received::new();
    space
        .receive(back, &mut m, ReceiveOptions { timeout: Some(WATCHDOG), ..Default::default() })
        .map_err(|e| format!("server did not start: {e}"))?;
    let port = m.ports.first().ok_or("no port from the server")?.name;
    let pid = child.0.id();
    let mut server = Server { child, rt, port, pid, tid: 0 };
    let mut c = server.rt.connect(port).map_err(|e| e.to_string())?;
    let mut reply = [0u8; 16];
    let n = c.call(b"tid", &mut reply, opts()).map_err(|e| e.to_string())?;
    server.tid = u32::from_le_bytes(reply[..n.min(4)].try_into().map_err(|_| "short tid")?);
    Ok(server)
}

fn opts() -> SendOptions {
    SendOptions { timeout: Some(WATCHDOG), ..SendOptions::default() }
}

fn server_role() -> i32 {
    let label = std::env::var("RTIPC_ATTRS").expect("attrs");
    let _ = pin_current_thread(0);
    let _ = set_current_policy(Policy::Fifo { priority: SERVER_PRIO });
    let space = Space::task();
    let back = space.take_bootstrap().expect("bootstrap").expect("a bootstrap right");
    let rt = RtSpace::new(space.clone());
    let port = rt.allocate(attrs_named(&label)).expect("allocate");
    let mut m = Message::new(1, Vec::new());
    m.ports.push(PortArg::new(port, Disposition::CopySend));
    space.send(back, &mut m, IpcSend::default()).expect("send port");
    let mut r = if std::env::var("RTIPC_SET").as_deref() == Ok("1") {
        let set = rt.allocate_set().expect("allocate set");
        rt.move_member(port, set).expect("move into the set");
        rt.associate_set(set, None).expect("associate with the set")
    } else {
        rt.associate(port, None).expect("associate")
    };
    let mut req = r.request_buffer();
    loop {
        if r.receive(&mut req, None).is_err() {
            return 0;
        }
        let data = req.data().to_vec();
        let out: Vec<u8> = if data == b"tid" {
            r.tid().to_le_bytes().to_vec()
        } else if data == b"stats" {
            let s = rt.stats(port).expect("stats");
            [s.free_buffers as u32, s.buffers as u32, s.connections as u32]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect()
        } else if let Some(path) = data.strip_prefix(b"hold:") {
            // Hold the request until the file exists (the test's signal), or 60 s.
            let path = std::path::PathBuf::from(String::from_utf8_lossy(path).into_owned());
            let until = Instant::now() + WATCHDOG;
            while !path.exists() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(2));
            }
            b"held".to_vec()
        } else {
            b"pong".to_vec()
        };
        if req.sync {
            let _ = r.reply(&mut req, &out);
        }
    }
}

fn client_role() -> i32 {
    let prio: u8 = std::env::var("RTIPC_PRIO").ok().and_then(|p| p.parse().ok()).unwrap_or(CLIENT_PRIO);
    let _ = pin_current_thread(0);
    let _ = set_current_policy(Policy::Fifo { priority: prio });
    let space = Space::task();
    let port = space.take_bootstrap().expect("bootstrap").expect("a bootstrap right");
    let rt = RtSpace::new(space);
    let mut c = rt.connect(port).expect("connect");
    if let (Ok(ready), Ok(go)) = (std::env::var("RTIPC_READY"), std::env::var("RTIPC_GO")) {
        let _ = std::fs::write(ready, b"connected");
        let until = Instant::now() + WATCHDOG;
        while !std::path::Path::new(&go).exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let mut reply = [0u8; 16];
    match c.call(b"ping", &mut reply, opts()) {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("client: {e}");
            1
        }
    }
}

/// How many asynchronous requests the `sender` role sends before it says so.
const SENT_BEFORE_KILL: usize = 6;

/// The `sender` role: connects, makes one call (so the port has accepted it), sends
/// [`SENT_BEFORE_KILL`] asynchronous requests `m0`, `m1`, … with rising priorities, says
/// so by writing `RTIPC_READY`, and waits to be killed.
fn sender_role() -> i32 {
    let space = Space::task();
    let port = space.take_bootstrap().expect("bootstrap").expect("a bootstrap right");
    let rt = RtSpace::new(space);
    let mut c = rt.connect(port).expect("connect");
    let mut reply = [0u8; 16];
    if let Err(e) = c.call(b"hello", &mut reply, opts()) {
        eprintln!("sender: {e}");
        return 1;
    }
    for i in 0..SENT_BEFORE_KILL {
        let body = format!("m{i}");
        let o = SendOptions { priority: Some(10 + i as u8), ..opts() };
        if let Err(e) = c.send(body.as_bytes(), o) {
            eprintln!("sender: {e}");
            return 1;
        }
    }
    let _ = std::fs::write(std::env::var("RTIPC_READY").expect("ready file"), b"sent");
    std::thread::sleep(WATCHDOG);
    0
}

/// A client sends asynchronous requests and is killed with `kill -9` at once, while
/// they wait in the port's queue (a priority port reads ahead) or in the kernel's (a
/// FIFO port reads two per wait): every one is
/// delivered (Mach delivers what was queued before its sender died), in the port's
/// order, and afterwards nothing of the client is left (connection, buffers, its
/// hung-up place).
fn killed_sender_test(label: &str) -> Result<(), String> {
    let space = Space::new();
    let rt = RtSpace::new(space.clone());
    let port = rt.allocate(attrs_named(label)).map_err(|e| e.to_string())?;
    let ready = std::env::temp_dir().join(format!("rtipc-sent-{}-{}", std::process::id(), label.replace('/', "-")));
    let _ = std::fs::remove_file(&ready);
    let mut child = spawn(&space, "sender", port, &[("RTIPC_READY", ready.display().to_string())]);
    let mut r = rt.associate(port, None).map_err(|e| e.to_string())?;
    let mut req = r.request_buffer();
    r.receive(&mut req, Some(WATCHDOG)).map_err(|e| format!("hello: {e}"))?;
    if req.data() != b"hello" || !req.sync {
        return Err(format!("expected the hello call, got {:?}", String::from_utf8_lossy(req.data())));
    }
    r.reply(&mut req, b"ok").map_err(|e| e.to_string())?;
    wait_until("the client sent its requests", || ready.exists())?;
    let _ = std::fs::remove_file(&ready);
    // One taken now: a wait reads two, so the next waits in the port's own queue.
    let mut got = Vec::new();
    r.receive(&mut req, Some(WATCHDOG)).map_err(|e| format!("first request: {e}"))?;
    got.push(String::from_utf8_lossy(req.data()).into_owned());
    child.0.kill().map_err(|e| e.to_string())?;
    child.0.wait().map_err(|e| e.to_string())?;
    wait_until("the client's hang-up seen", || rt.stats(port).is_some_and(|s| s.connections == 0))?;
    let s = rt.stats(port).ok_or("no stats")?;
    // Those not yet read from the kernel's queue need the client's place kept; once
    // all are in the port's own queue (a priority port reads ahead), nothing is kept.
    let unread = s.waiting < SENT_BEFORE_KILL - 1;
    if s.hung_up != usize::from(unread) {
        return Err(format!("hung-up place kept wrongly (unread requests: {unread}): {s:?}"));
    }
    for _ in 1..SENT_BEFORE_KILL {
        r.receive(&mut req, Some(WATCHDOG)).map_err(|e| format!("after the kill ({got:?} so far): {e}"))?;
        if req.sync {
            return Err("an asynchronous request arrived as a call".into());
        }
        got.push(String::from_utf8_lossy(req.data()).into_owned());
    }
    // Nothing else comes, and the wait that finds the queue empty forgets the client.
    match r.receive(&mut req, Some(Duration::from_millis(100))) {
        Err(ictus_rtipc::ReceiveError::TimedOut) => {}
        other => return Err(format!("expected nothing more, got {other:?}")),
    }
    // A FIFO port delivers them in order; a priority port in its own order, but all.
    let want: Vec<String> = (0..SENT_BEFORE_KILL).map(|i| format!("m{i}")).collect();
    if !label.starts_with("FIFO") {
        got.sort();
    }
    if got != want {
        return Err(format!("delivered {got:?}, expected {want:?}"));
    }
    let s = rt.stats(port).ok_or("no stats")?;
    if s.hung_up != 0 || s.connections != 0 || s.waiting != 0 || s.free_buffers != s.buffers || s.malformed != 0 {
        return Err(format!("the dead client left something behind: {s:?}"));
    }
    drop(r);
    rt.destroy(port).map_err(|e| e.to_string())?;
    Ok(())
}

/// Burns CPU for a fixed amount of work (not time), checking a flag as it goes.
fn work(units: u64, progress: &AtomicU64) {
    let mut x = 1.000_001f64;
    for u in 0..units {
        for _ in 0..20_000 {
            x = std::hint::black_box(x * 1.000_000_1 + 1e-9).sqrt().max(1.0);
        }
        progress.store(u + 1, Ordering::SeqCst);
    }
    std::hint::black_box(x);
}

/// The inversion test. On CPU 0: a server at `SCHED_FIFO 10`, a hog at 20 that
/// does a fixed amount of work, a client at 30 that calls the server while the hog
/// runs. Records whether the reply arrived before the hog finished.
fn reply_before_hog_finishes(label: &str) -> Result<bool, String> {
    let server = start_server(label)?;
    let hog_started = Arc::new(AtomicBool::new(false));
    let hog_done = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicU64::new(0));
    // Enough work to last far longer than a round trip, short of RT throttling (950 ms
    // of every second); its length does not decide the outcome, priorities do.
    const UNITS: u64 = 400;
    let rt = server.rt.clone();
    let port = server.port;
    let (started, done, progress2) = (hog_started.clone(), hog_done.clone(), progress.clone());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let client = std::thread::spawn(move || -> Result<(bool, u64), String> {
        pin_current_thread(0).map_err(|e| e.to_string())?;
        set_current_policy(Policy::Fifo { priority: CLIENT_PRIO }).map_err(|e| e.to_string())?;
        let mut c = rt.connect(port).map_err(|e| e.to_string())?;
        let until = Instant::now() + WATCHDOG;
        // The server is back waiting for messages before the hog starts.
        while !c.receiver_waiting() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = ready_tx.send(());
        // Sleep (so the hog runs) until the hog has done some work; we preempt it then.
        while progress2.load(Ordering::SeqCst) < 5 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        if !started.load(Ordering::SeqCst) {
            return Err("hog never started".into());
        }
        let mut reply = [0u8; 16];
        c.call(b"ping", &mut reply, opts()).map_err(|e| e.to_string())?;
        Ok((!done.load(Ordering::SeqCst), progress2.load(Ordering::SeqCst)))
    });
    ready_rx.recv_timeout(WATCHDOG).map_err(|_| "client did not connect")?;
    let hog = {
        let (started, done, progress) = (hog_started.clone(), hog_done.clone(), progress.clone());
        std::thread::spawn(move || -> Result<(), String> {
            pin_current_thread(0).map_err(|e| e.to_string())?;
            set_current_policy(Policy::Fifo { priority: HOG_PRIO }).map_err(|e| e.to_string())?;
            started.store(true, Ordering::SeqCst);
            work(UNITS, &progress);
            done.store(true, Ordering::SeqCst);
            Ok(())
        })
    };
    let (before, at) = client.join().map_err(|_| "client panicked")??;
    hog.join().map_err(|_| "hog panicked")??;
    eprintln!("  {label}: reply {} the hog finished (hog at {at}/{UNITS})", if before { "before" } else { "after" });
    drop(server);
    Ok(before)
}

fn inversion_test() -> Result<(), String> {
    if !rt_ok() {
        println!("  skipped: SCHED_FIFO is refused here (needs root, CAP_SYS_NICE or RLIMIT_RTPRIO)");
        return Ok(());
    }
    if reply_before_hog_finishes("FIFO/OFF")? {
        return Err("FIFO/OFF: the low-priority server answered while the hog ran".into());
    }
    for label in ["PRIO/ON", "BPI/OFF", "BPI/ON"] {
        if !reply_before_hog_finishes(label)? {
            return Err(format!("{label}: the reply waited for the medium-priority hog"));
        }
    }
    Ok(())
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) -> Result<(), String> {
    let until = Instant::now() + WATCHDOG;
    while !f() {
        if Instant::now() > until {
            return Err(format!("watchdog: {what}"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

fn stats(rt: &RtSpace, port: Name) -> Result<(u32, u32, u32), String> {
    let mut c = rt.connect(port).map_err(|e| e.to_string())?;
    let mut reply = [0u8; 16];
    let n = c.call(b"stats", &mut reply, opts()).map_err(|e| e.to_string())?;
    if n != 12 {
        return Err("bad stats".into());
    }
    let w = |i: usize| u32::from_le_bytes(reply[i * 4..i * 4 + 4].try_into().expect("4"));
    Ok((w(0), w(1), w(2)))
}

/// A high-priority client that the server inherits from (BPI) is killed with `kill -9`:
/// the kernel drops the boost, and the server frees the client's buffer and connection.
/// With `in_set` the server receives through a real-time port set holding the port.
fn killed_client_test(in_set: bool) -> Result<(), String> {
    let server = start_server_in("BPI/OFF", in_set)?;
    let base = effective_priority(server.pid, server.tid).ok_or("no /proc stat")?;
    let flag = std::env::temp_dir().join(format!("rtipc-hold-{}", std::process::id()));
    let _ = std::fs::remove_file(&flag);
    // The client connects first (connections are accepted by waiting receivers),
    // then calls when told, which is after we keep the server busy.
    let ready = std::env::temp_dir().join(format!("rtipc-ready-{}", std::process::id()));
    let go = std::env::temp_dir().join(format!("rtipc-go-{}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let _ = std::fs::remove_file(&go);
    let mut client = spawn(
        server.rt.space(),
        "client",
        server.port,
        &[
            ("RTIPC_PRIO", "40".to_string()),
            ("RTIPC_READY", ready.display().to_string()),
            ("RTIPC_GO", go.display().to_string()),
        ],
    );
    wait_until("client connected", || ready.exists())?;
    // Keep the server busy with our request.
    let rt = server.rt.clone();
    let port = server.port;
    let hold = format!("hold:{}", flag.display()).into_bytes();
    let probe = server.rt.connect(port).map_err(|e| e.to_string())?;
    let (connected_tx, connected_rx) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || -> Result<(), String> {
        let mut c = rt.connect(port).map_err(|e| e.to_string())?;
        let _ = connected_tx.send(());
        let mut reply = [0u8; 16];
        c.call(&hold, &mut reply, opts()).map_err(|e| e.to_string())?;
        Ok(())
    });
    connected_rx.recv_timeout(WATCHDOG).map_err(|_| "holder did not connect")?;
    // Busy for good (not just between two waits): not waiting at 5 looks in a row.
    let mut busy_looks = 0;
    wait_until("server busy with the held request", || {
        std::thread::sleep(Duration::from_millis(10));
        busy_looks = if probe.receiver_waiting() { 0 } else { busy_looks + 1 };
        busy_looks >= 5
    })?;
    std::fs::write(&go, b"go").map_err(|e| e.to_string())?;
    let privileged = rt_ok();
    if privileged {
        // The client waits in FUTEX_LOCK_PI on a word naming the server: the kernel
        // raises the server to the client's priority (prio field -1 - 40).
        wait_until("server boosted by the waiting client", || effective_priority(server.pid, server.tid) == Some(-41))?;
    } else {
        std::thread::sleep(Duration::from_millis(100));
    }
    client.0.kill().map_err(|e| e.to_string())?;
    client.0.wait().map_err(|e| e.to_string())?;
    wait_until("boost gone with the client", || effective_priority(server.pid, server.tid) == Some(base))?;
    std::fs::write(&flag, b"go").map_err(|e| e.to_string())?;
    holder.join().map_err(|_| "holder panicked")??;
    drop(probe);
    for f in [&flag, &ready, &go] {
        let _ = std::fs::remove_file(f);
    }
    // The dead client's request and connection are gone; every buffer is free.
    let mut last = (0, 0, 0);
    wait_until("dead client's buffer and connection freed", || {
        // Only our stats call's own connection is left (holder, probe, client closed).
        last = stats(&server.rt, server.port).unwrap_or((0, 1, 99));
        last.0 == last.1 && last.2 == 1
    })
    .map_err(|e| format!("{e}: free/buffers/connections = {last:?}"))?;
    if effective_priority(server.pid, server.tid) != Some(base) {
        return Err("server priority not back to base".into());
    }
    if !privileged {
        println!("  (no SCHED_FIFO here: checked clean-up only, not the boost)");
    }
    Ok(())
}

/// A server killed with `kill -9` while a client inherits into it: the client's call
/// ends with `ServerDied`, not a hang.
fn killed_server_test() -> Result<(), String> {
    let mut server = start_server("BPI/ON")?;
    let flag = std::env::temp_dir().join(format!("rtipc-never-{}", std::process::id()));
    let rt = server.rt.clone();
    let port = server.port;
    let hold = format!("hold:{}", flag.display()).into_bytes();
    let caller = std::thread::spawn(move || -> Result<SendError, String> {
        let mut c = rt.connect(port).map_err(|e| e.to_string())?;
        let mut reply = [0u8; 16];
        match c.call(&hold, &mut reply, opts()) {
            Ok(_) => Err("the held call returned".into()),
            Err(e) => Ok(e),
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    server.child.0.kill().map_err(|e| e.to_string())?;
    server.child.0.wait().map_err(|e| e.to_string())?;
    let e = caller.join().map_err(|_| "caller panicked")??;
    if !matches!(e, SendError::ServerDied) {
        return Err(format!("expected ServerDied, got {e}"));
    }
    Ok(())
}

/// A plain port held by another task: connecting to it is an invalid destination.
fn remote_plain_port_test() -> Result<(), String> {
    let space = Space::new();
    let rt = RtSpace::new(space.clone());
    // A plain ictus port whose receiver is in this process but reached through a
    // right that came from elsewhere is the same to the sender; use a thread receiving.
    let plain = space.allocate_port_with_send().map_err(|e| e.to_string())?;
    let s2 = space.clone();
    let t = std::thread::spawn(move || {
        let mut m = Received::new();
        let _ = s2.receive(plain, &mut m, ReceiveOptions { timeout: Some(WATCHDOG), ..Default::default() });
    });
    match rt.connect(plain) {
        Err(SendError::InvalidDest(..)) => {}
        Err(e) => return Err(format!("expected InvalidDest, got {e}")),
        Ok(_) => return Err("connected to a plain port".into()),
    }
    t.join().map_err(|_| "receiver panicked")?;
    Ok(())
}

fn unprivileged_test() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        println!("  not root: cannot drop to uid 65534; this run is already the unprivileged path");
        return unprivileged_body().map(|_| ());
    }
    let mut cmd = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
    cmd.env(ROLE, "unprivileged");
    let out = cmd.output().map_err(|e| e.to_string())?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("unprivileged child failed: {}{stderr}", String::from_utf8_lossy(&out.stdout)));
    }
    // One warning, once.
    if stderr.matches("priority hand-off is off").count() != 1 {
        return Err(format!("expected exactly one hand-off warning, got: {stderr}"));
    }
    Ok(())
}

fn unprivileged_role() -> i32 {
    const NOBODY: u32 = 65534;
    // SAFETY: setgroups/setresgid/setresuid take values (and a null list of length 0);
    // this process is single-threaded here.
    let dropped = unsafe {
        let zero = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::setrlimit(libc::RLIMIT_RTPRIO, &zero) == 0
            && libc::setgroups(0, std::ptr::null()) == 0
            && libc::setresgid(NOBODY, NOBODY, NOBODY) == 0
            && libc::setresuid(NOBODY, NOBODY, NOBODY) == 0
    };
    if !dropped {
        eprintln!("could not drop privileges");
        return 3;
    }
    match unprivileged_body() {
        Ok(true) => 0,
        Ok(false) => 4,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// PRIO/ON and BPI/ON ports work without privilege: calls succeed, the queue still
/// orders by the priority messages carry, and hand-off is reported off.
fn unprivileged_body() -> Result<bool, String> {
    for label in ["PRIO/ON", "BPI/ON", "PRIO/MSG"] {
        let rt = RtSpace::new(Space::new());
        let port = rt.allocate(attrs_named(label)).map_err(|e| e.to_string())?;
        let rt2 = rt.clone();
        let server = std::thread::spawn(move || {
            let mut r = rt2.associate(port, None).expect("associate");
            let mut req = r.request_buffer();
            while r.receive(&mut req, None).is_ok() {
                let _ = r.reply(&mut req, b"ok");
            }
        });
        let mut c = rt.connect(port).map_err(|e| e.to_string())?;
        let mut reply = [0u8; 4];
        for _ in 0..20 {
            // A real-time priority in the header: the hand-off to it is refused.
            let o = SendOptions { priority: Some(50), ..opts() };
            c.call(b"x", &mut reply, o).map_err(|e| format!("{label}: {e}"))?;
        }
        rt.destroy(port).map_err(|e| e.to_string())?;
        server.join().map_err(|_| "server panicked")?;
    }
    Ok(!ictus_rtipc::prio::handoff_available() || rustix::process::geteuid().is_root())
}
