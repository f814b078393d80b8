//! Helpers shared by the multi-process and hostile-input tests: child processes that
//! re-execute this test binary, resource accounting from `/proc/self`, raw datagrams.
//!
//! Every wait here is bounded by a generous watchdog and waits for an *event*; no test
//! asserts how long anything took.
#![allow(dead_code)] // each test binary uses its own subset

use std::collections::{BTreeMap, BTreeSet};
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ictus_abi::{Datagram, Descriptor, Head, ReplyKind};
use ictus_ipc::{Name, ReceiveError, ReceiveOptions, Received, Space};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// How long any single wait may take before the test is declared hung.
pub const WATCHDOG: Duration = Duration::from_secs(30);
/// Names the role a re-executed test binary plays; absent in the normal test run.
pub const ROLE_ENV: &str = "ICTUS_TEST_ROLE";
/// The pid of the test process that spawned a child.
pub const PARENT_ENV: &str = "ICTUS_TEST_PARENT";

/// Longest any one test may run. A test stuck past it (a deadlock in the nucleus
/// cannot be interrupted from the stuck thread) ends the whole test process with an
/// error instead of hanging CI.
pub const TEST_LIMIT: Duration = Duration::from_secs(180);

/// Held for the whole of a test: tests in one binary run one at a time, because they
/// count the whole process's descriptors and mappings, which a concurrent test would
/// disturb. Also a watchdog on the test (see [`TEST_LIMIT`]).
#[derive(Debug)]
pub struct Serial {
    _lock: MutexGuard<'static, ()>,
    _done: std::sync::mpsc::Sender<()>,
}

/// Take the lock that serialises this binary's tests, and arm the test's watchdog.
pub fn serial() -> Serial {
    static LOCK: Mutex<()> = Mutex::new(());
    let lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (done, rx) = std::sync::mpsc::channel::<()>();
    let name = std::thread::current().name().unwrap_or("?").to_string();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(TEST_LIMIT) {
            eprintln!("test {name} is stuck after {TEST_LIMIT:?}: ending the test process");
            std::process::exit(101);
        }
    });
    Serial { _lock: lock, _done: done }
}

/// Receive options with a timeout.
pub fn within(timeout: Duration) -> ReceiveOptions {
    ReceiveOptions { timeout: Some(timeout), ..Default::default() }
}

/// Receive one message, or fail the test after the watchdog.
#[track_caller]
pub fn recv(space: &Space, name: Name) -> Received {
    let mut r = Received::new();
    if let Err(e) = space.receive(name, &mut r, within(WATCHDOG)) {
        panic!("receive on {name} failed: {e}");
    }
    r
}

/// Receive one message that must be refused as malformed; returns the reason.
#[track_caller]
pub fn recv_malformed(space: &Space, name: Name) -> String {
    let mut r = Received::new();
    match space.receive(name, &mut r, within(WATCHDOG)) {
        Err(ReceiveError::Malformed { reason, .. }) => reason,
        Err(e) => panic!("expected a malformed-message error, got {e:?}"),
        Ok(()) => panic!("a hostile message was accepted: {r:?}"),
    }
}

/// Assert that nothing is queued on `name` right now.
#[track_caller]
pub fn assert_empty(space: &Space, name: Name) {
    let mut r = Received::new();
    match space.receive(name, &mut r, within(Duration::ZERO)) {
        Err(ReceiveError::TimedOut) => {}
        other => panic!("expected an empty queue on {name}, got {other:?} {r:?}"),
    }
}

// ----- resource accounting -------------------------------------------------------------

/// The process's open descriptors, each with what it refers to.
pub fn open_fds() -> BTreeMap<i32, String> {
    let dir = std::fs::read_dir("/proc/self/fd").expect("read /proc/self/fd");
    let mut out = BTreeMap::new();
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        // The directory listing's own descriptor is gone by the time we read its link.
        if let Ok(target) = std::fs::read_link(e.path()) {
            let target = target.to_string_lossy().into_owned();
            if target.starts_with("/proc/") && target.ends_with("/fd") {
                continue;
            }
            out.insert(fd, target);
        }
    }
    out
}

/// Mappings of memfds (out-of-line regions and big in-line data) in this process.
pub fn memfd_mappings() -> usize {
    maps_of("self")
}

/// Mappings of memfds in process `pid` (`"self"` for this one), other than ports'
/// queue pages.
pub fn maps_of(pid: &str) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|m| m.lines().filter(|l| l.contains("memfd:") && !l.contains("memfd:ictus-queue")).count())
        .unwrap_or(0)
}

/// Mappings of ports' queue pages in this process (a port's own, and a sender's of
/// each port it sends to).
pub fn queue_page_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.lines().filter(|l| l.contains("memfd:ictus-queue")).count())
        .unwrap_or(0)
}

/// What a test may leak: descriptors, memfd mappings, queue pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resources {
    pub fds: BTreeMap<i32, String>,
    pub memfd_maps: usize,
    pub queue_maps: usize,
}

impl Resources {
    pub fn now() -> Resources {
        Resources { fds: open_fds(), memfd_maps: memfd_mappings(), queue_maps: queue_page_mappings() }
    }

    /// A baseline: what the process holds once nothing is being torn down any more
    /// (the same on two looks 20 ms apart). A space whose last handle went on its own
    /// notifier thread (which may hold it for a moment while it handles an event) closes
    /// that thread's descriptors just after; a previous test's could still be going.
    pub fn settled() -> Resources {
        let deadline = Instant::now() + WATCHDOG;
        let mut last = Resources::now();
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let now = Resources::now();
            if now == last || Instant::now() >= deadline {
                return now;
            }
            last = now;
        }
    }

    fn diff(&self, other: &Resources) -> String {
        let gone: Vec<_> = self.fds.iter().filter(|(k, v)| other.fds.get(k) != Some(v)).collect();
        let new: Vec<_> = other.fds.iter().filter(|(k, v)| self.fds.get(k) != Some(v)).collect();
        format!(
            "descriptors closed: {gone:?}\ndescriptors opened: {new:?}\nmemfd mappings: {} -> {}\nqueue pages: {} -> {}",
            self.memfd_maps, other.memfd_maps, self.queue_maps, other.queue_maps
        )
    }
}

/// Wait until the process holds exactly the descriptors and mappings of `baseline`,
/// and fail the test with the difference if it does not within the watchdog. (Some
/// teardown is asynchronous: a dropped space's notifier thread closes its epoll and
/// eventfd when it wakes up.)
#[track_caller]
pub fn assert_back_to(baseline: &Resources, what: &str) {
    let deadline = Instant::now() + WATCHDOG;
    loop {
        let now = Resources::now();
        if &now == baseline {
            return;
        }
        if Instant::now() >= deadline {
            panic!("{what}: resources did not return to the baseline\n{}", baseline.diff(&now));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Assert the process holds exactly `baseline` right now (nothing asynchronous pending).
#[track_caller]
pub fn assert_same(baseline: &Resources, what: &str) {
    let now = Resources::now();
    assert!(&now == baseline, "{what}: resources differ from the baseline\n{}", baseline.diff(&now));
}

/// Socket files under /tmp and `$XDG_RUNTIME_DIR`, and every entry of /dev/shm: where a
/// port implementation that used names in the file system would leave traces.
pub fn fs_traces() -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut roots = vec![PathBuf::from("/tmp")];
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        roots.push(PathBuf::from(x));
    }
    for r in &roots {
        walk_sockets(r, 6, &mut out);
    }
    if let Ok(d) = std::fs::read_dir("/dev/shm") {
        out.extend(d.flatten().map(|e| e.path()));
    }
    out
}

/// Assert that no trace appeared since `before` ([`fs_traces`]) that this test could have
/// left. The machine may be shared (other tests, benchmarks, servers): an entry that
/// another live process holds open or mapped is that process's, not ours, and is left
/// out; one that nobody holds, or that this process holds, counts.
#[track_caller]
pub fn assert_no_new_traces(before: &BTreeSet<PathBuf>, what: &str) {
    let new: BTreeSet<PathBuf> = fs_traces().difference(before).cloned().collect();
    if new.is_empty() {
        return;
    }
    let foreign = held_by_other_processes();
    let ours: BTreeSet<&PathBuf> = new.iter().filter(|p| !foreign.contains(*p)).collect();
    assert!(ours.is_empty(), "{what}: a socket or shared-memory file appeared: {ours:?}");
}

/// Paths that processes other than this one hold: files open or mapped under /dev/shm,
/// and socket files (by the inode /proc/net/unix gives their path).
fn held_by_other_processes() -> BTreeSet<PathBuf> {
    let mut socket_paths = std::collections::HashMap::new();
    for line in std::fs::read_to_string("/proc/net/unix").unwrap_or_default().lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let (Some(inode), Some(path)) = (f.get(6), f.get(7)) {
            socket_paths.insert(format!("socket:[{inode}]"), PathBuf::from(path));
        }
    }
    let me = std::process::id().to_string();
    let mut held = BTreeSet::new();
    for proc_dir in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = proc_dir.file_name();
        let Some(pid) = pid.to_str().filter(|p| p.bytes().all(|b| b.is_ascii_digit())) else { continue };
        if pid == me {
            continue;
        }
        for fd in std::fs::read_dir(proc_dir.path().join("fd")).into_iter().flatten().flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                match target.to_str().and_then(|t| socket_paths.get(t)) {
                    Some(path) => held.insert(path.clone()),
                    None => held.insert(target),
                };
            }
        }
        let maps = std::fs::read_to_string(proc_dir.path().join("maps")).unwrap_or_default();
        held.extend(maps.lines().filter_map(|l| l.split_whitespace().nth(5)).map(PathBuf::from));
    }
    held
}

fn walk_sockets(dir: &Path, depth: u32, out: &mut BTreeSet<PathBuf>) {
    use std::os::unix::fs::FileTypeExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_socket() {
            out.insert(e.path());
        } else if ft.is_dir() && depth > 0 {
            walk_sockets(&e.path(), depth - 1, out);
        }
    }
}

/// Whether the far side of a pipe or socket `fd` has been closed everywhere: the
/// kernel reports a hang-up. Used as a witness that a descriptor sent away was closed
/// by whoever received it.
pub fn peer_closed(fd: BorrowedFd<'_>) -> bool {
    let mut pfd = [PollFd::new(&fd, PollFlags::IN)];
    matches!(poll(&mut pfd, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })), Ok(n) if n > 0)
        && pfd[0].revents().contains(PollFlags::HUP)
}

// ----- raw datagrams -------------------------------------------------------------------

/// Send `bytes` with `fds` as one datagram on a raw socket, as a hostile task would:
/// no validation at all.
pub fn raw_send(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> rustix::io::Result<usize> {
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)), "control buffer too small");
    }
    rustix::net::sendmsg(sock, &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)
}

/// Receive one datagram and its descriptors from a raw socket, as a hostile task
/// would; waits at most the watchdog.
#[track_caller]
pub fn raw_recv(sock: BorrowedFd<'_>) -> (Vec<u8>, Vec<OwnedFd>) {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    // Aligned for `cmsghdr`, so that all of it is usable.
    #[repr(C, align(8))]
    struct Control([MaybeUninit<u8>; rustix::cmsg_space!(ScmRights(16), ScmCredentials(1))]);
    let mut pfd = [PollFd::new(&sock, PollFlags::IN)];
    let ts = Timespec { tv_sec: WATCHDOG.as_secs() as i64, tv_nsec: 0 };
    assert!(matches!(poll(&mut pfd, Some(&ts)), Ok(1)), "nothing arrived on the raw socket");
    let mut space = Control([MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(16), ScmCredentials(1))]);
    let mut control = RecvAncillaryBuffer::new(&mut space.0);
    let mut buf = vec![0u8; ictus_abi::DATAGRAM_MAX];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let m = rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT)
        .expect("recvmsg");
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(r) = msg {
            fds.extend(r);
        }
    }
    buf.truncate(m.bytes);
    (buf, fds)
}

/// A correctly encoded datagram (the hostile tests then break it). A channel reply
/// kind gets the token 1.
pub fn encode(id: i32, reply: ReplyKind, descriptors: &[Descriptor], inline: &[u8], big_len: u64) -> Vec<u8> {
    let token = u32::from(reply.has_token());
    let mut v = Vec::new();
    Datagram::encode(Head { id, reply, token, kept: false, counted: false }, descriptors, inline, big_len, &mut v)
        .expect("encode");
    v
}

/// Borrow a list of owned descriptors.
pub fn borrow_all(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(|f| f.as_fd()).collect()
}

// ----- child processes ------------------------------------------------------------------

/// In a test function that doubles as a child's body: `true` if this process was
/// spawned to play `role`. Arms `PR_SET_PDEATHSIG` so that the child cannot outlive
/// the test that spawned it.
pub fn child_role(role: &str) -> bool {
    if std::env::var(ROLE_ENV).ok().as_deref() != Some(role) {
        return false;
    }
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)).expect("PR_SET_PDEATHSIG");
    // If the parent died before the signal was armed, nobody would ever kill us.
    let parent: i32 = std::env::var(PARENT_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    if rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get()) != parent {
        std::process::exit(3);
    }
    true
}

/// The pid of the process that spawned this child.
pub fn parent_pid() -> u32 {
    std::env::var(PARENT_ENV).expect("parent pid").parse().expect("parent pid")
}

/// A command that re-executes this test binary to run only `test` as `role`.
pub fn child_command(test: &str, role: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("current_exe"));
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .env(PARENT_ENV, std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A running child. Killed and reaped on drop, so a failing test leaves nothing behind.
#[derive(Debug)]
pub struct ChildGuard {
    child: Option<Child>,
    what: String,
}

impl ChildGuard {
    /// Spawn `cmd` (which is dropped here, closing the parent's copies of whatever
    /// the command was to give the child).
    pub fn spawn(mut cmd: Command, what: &str) -> ChildGuard {
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        drop(cmd);
        ChildGuard { child: Some(child), what: what.to_string() }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Wait for the child to exit and check that its test passed.
    #[track_caller]
    pub fn expect_success(mut self) {
        let out = self.wait_output();
        assert!(out.status.success(), "child {} failed: {}\n{}", self.what, out.status, show(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        // The child's body must actually have run: exactly one test passed.
        assert!(stdout.contains("1 passed"), "child {} ran no test (filter mismatch?)\n{}", self.what, show(&out));
    }

    /// `kill -9` the child and reap it.
    pub fn kill9(mut self) -> Output {
        if let Some(c) = self.child.as_mut() {
            c.kill().expect("kill -9");
        }
        let out = self.wait_output();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(9), "child {} was not killed by SIGKILL\n{}", self.what, show(&out));
        out
    }

    fn wait_output(&mut self) -> Output {
        // The pipes only carry the child's test harness chatter, far less than a pipe
        // buffer, so the child cannot block on them before exiting.
        let child = self.child.take().expect("running");
        wait_bounded(child, &self.what)
    }
}

/// Reap a child, killing it if it outlives the watchdog.
fn wait_bounded(mut child: Child, what: &str) -> Output {
    let deadline = Instant::now() + WATCHDOG * 2;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("wait");
                panic!("child {what} hung; killed it\n{}", show(&out));
            }
        }
    }
    child.wait_with_output().expect("wait")
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn show(out: &Output) -> String {
    format!(
        "--- child stdout ---\n{}\n--- child stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Whether `fd` becomes readable within `timeout` (zero: whether it is now).
pub fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let ts = Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: i64::from(timeout.subsec_nanos()) };
    let mut pfd = [PollFd::new(&fd, PollFlags::IN)];
    loop {
        match poll(&mut pfd, Some(&ts)) {
            Ok(n) => return n > 0 && pfd[0].revents().contains(PollFlags::IN),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => panic!("poll: {e}"),
        }
    }
}
