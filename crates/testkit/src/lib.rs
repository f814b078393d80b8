//! What ictus's multi-process tests share: private temporary directories, watchdogs,
//! child processes that never outlive a test, this test binary re-run in a role, and
//! the name, clock and MIDI servers started, waited for and stopped.
//!
//! For tests only (`publish = false`, a dev-dependency). Nothing here asserts a
//! duration: every wait is for an event, bounded by a generous watchdog ([`WATCHDOG`])
//! whose expiry is a failure that says what was awaited.
//!
//! - [`TempDir`]: a fresh directory of mode `0700` (so a server's sockets in it are
//!   private to this user, as in the real runtime directory), removed on drop.
//! - [`wait_until`], [`WATCHDOG`]: polling for a condition, within the watchdog;
//!   [`wait_thread_asleep`], [`wait_all_asleep`]: until threads are blocked in the kernel.
//! - [`Proc`]: a child process, killed and reaped on drop; `kill -9`, `SIGTERM`, waits
//!   within the watchdog, its standard error in a log file, its tagged lines.
//! - [`Role`]: this test binary run again as a child in a named role (`--exact TEST`),
//!   dying with its parent (`PR_SET_PDEATHSIG`); [`Role::alone`] for a test that counts
//!   the whole process's descriptors or mappings.
//! - Servers on threads of the test: [`NameServer`] (on a socket in its own private
//!   directory), [`ClockServer`] and [`MidiServer`] (registered with a `NameServer`,
//!   again after it restarts).
//! - Servers as processes of the `ictus` binary, for the command's own tests:
//!   [`ictus_name_server()`], [`spawn_ictus_name_server`].

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ictus_ipc::{Name, Space};
use ictus_server::Registrar;

/// How long any wait may last before the test fails: long, so that only a hang (not a
/// loaded machine) trips it.
pub const WATCHDOG: Duration = Duration::from_secs(60);

/// A name unique in this process and across processes: `TAG-PID-N`.
pub fn unique(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Poll `cond` every 10 ms until it holds; fail the test, naming `what`, if it does not
/// within [`WATCHDOG`].
pub fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    wait_until_within(what, WATCHDOG, cond);
}

/// [`wait_until`] with a watchdog of `limit`.
pub fn wait_until_within(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "watchdog: still waiting for {what} after {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The scheduler state of thread `tid` of process `pid` (`R`, `S`, `D`, `Z`…, from
/// `/proc/PID/task/TID/stat`), or `None` once it is gone.
pub fn thread_state(pid: u32, tid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// This thread's id (to hand to a waiter of [`wait_thread_asleep`]).
pub fn gettid() -> u32 {
    rustix::thread::gettid().as_raw_nonzero().get() as u32
}

/// Wait until thread `tid` of this process is asleep (blocked in the kernel) a few looks
/// in a row, within [`WATCHDOG`]; returns whether it happened. For a test that must act
/// while another thread is blocked (in a receive, a send, a wait for room), not before.
pub fn wait_thread_asleep(tid: u32) -> bool {
    let me = std::process::id();
    asleep_within(|| thread_state(me, tid) == Some('S'))
}

/// Wait until every thread of process `pid` is asleep, a few looks in a row, within
/// [`WATCHDOG`]; returns whether it happened. Used to kill a child while it is blocked in
/// a receive or a send rather than anywhere.
pub fn wait_all_asleep(pid: u32) -> bool {
    asleep_within(|| {
        let tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default();
        !tids.is_empty() && tids.iter().all(|&t| thread_state(pid, t) == Some('S'))
    })
}

/// Three looks in a row, 5 ms apart, that find `asleep` true (one look can catch a thread
/// between two system calls), within [`WATCHDOG`].
fn asleep_within(mut asleep: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + WATCHDOG;
    let mut streak = 0;
    while Instant::now() < deadline {
        streak = if asleep() { streak + 1 } else { 0 };
        if streak >= 3 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// A fresh directory under the system's temporary directory, private (`0700`) unless
/// made [`TempDir::shared`], removed (with everything in it) on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new private directory (mode `0700`) named after `tag`.
    pub fn new(tag: &str) -> TempDir {
        TempDir::with_mode(tag, 0o700)
    }

    /// A new directory other users may enter (mode `0755`), for tests in which another
    /// user must reach a socket whose own mode or server is what refuses them.
    pub fn shared(tag: &str) -> TempDir {
        TempDir::with_mode(tag, 0o755)
    }

    fn with_mode(tag: &str, mode: u32) -> TempDir {
        let p = std::env::temp_dir().join(unique(&format!("ictus-{tag}")));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("make the test's directory");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("set its mode");
        TempDir(p)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path inside it.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process that is killed (`SIGKILL`) and reaped if the test ends before it
/// does.
#[derive(Debug)]
pub struct Proc {
    child: Child,
    what: String,
    log: Option<PathBuf>,
}

impl Proc {
    /// Start `cmd` (standard input closed unless the command says otherwise); `what`
    /// names it in failures.
    pub fn spawn(what: &str, cmd: &mut Command) -> Proc {
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Proc { child, what: what.to_owned(), log: None }
    }

    /// Start `cmd` with its standard error written to the file `log` (see
    /// [`Proc::log`]), standard input and output closed.
    pub fn spawn_logged(what: &str, cmd: &mut Command, log: &Path) -> Proc {
        let file = std::fs::File::create(log).expect("create the log file");
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(file);
        let mut p = Proc::spawn(what, cmd);
        p.log = Some(log.to_owned());
        p
    }

    /// Take care of a child started elsewhere.
    pub fn from_child(what: &str, child: Child) -> Proc {
        Proc { child, what: what.to_owned(), log: None }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child, for what this type does not offer.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// What its standard error said so far (with [`Proc::spawn_logged`]).
    pub fn log(&self) -> String {
        self.log.as_ref().and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default()
    }

    /// Its exit status if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("wait for the child")
    }

    /// `kill -9`, and reap it; it must die of that signal.
    pub fn kill9(&mut self) {
        self.child.kill().expect("kill -9");
        let st = self.child.wait().expect("wait");
        assert_eq!(st.signal(), Some(9), "{} died of SIGKILL", self.what);
    }

    /// Send `SIGTERM` (it should stop cleanly).
    pub fn sigterm(&self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("kill -TERM");
    }

    /// `SIGSTOP`, and wait until every thread of it is stopped: `kill` returns before
    /// a thread running on another CPU, or just woken, has stopped, and until then it
    /// may still take a request.
    pub fn stop_all_threads(&self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::STOP).expect("kill -STOP");
        let tasks = format!("/proc/{}/task", self.child.id());
        wait_until(&format!("every thread of {} stopped", self.what), || {
            std::fs::read_dir(&tasks).expect("the task list").all(|t| {
                let stat = std::fs::read_to_string(t.expect("a task").path().join("stat")).unwrap_or_default();
                // The state follows the parenthesised command name, which may hold spaces.
                stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
            })
        });
    }

    /// `SIGCONT`: let a stopped process run again.
    pub fn resume(&self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::CONT).expect("kill -CONT");
    }

    /// `SIGTERM`, then wait for the exit within the watchdog.
    pub fn terminate(&mut self) -> ExitStatus {
        self.sigterm();
        self.wait()
    }

    /// Wait for it to exit, within the watchdog.
    pub fn wait(&mut self) -> ExitStatus {
        self.wait_within(WATCHDOG)
    }

    /// Wait for it to exit, within `limit`.
    pub fn wait_within(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.try_wait() {
                return st;
            }
            assert!(Instant::now() < deadline, "watchdog: {} did not exit; its log:\n{}", self.what, self.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Wait for it to exit by itself, within the watchdog; it must succeed.
    pub fn wait_success(&mut self) {
        let st = self.wait();
        assert!(st.success(), "{} failed: {st}; its log:\n{}", self.what, self.log());
    }

    /// Its standard output's lines (it must have been started with a piped standard
    /// output), from a thread: each line containing `tag`, from just after the tag.
    /// (libtest may print `test NAME ... ` on the same line first.)
    pub fn tagged_lines(&mut self, tag: &str) -> mpsc::Receiver<String> {
        let out = self.child.stdout.take().expect("a piped standard output");
        let (tx, rx) = mpsc::channel();
        let tag = tag.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find(&tag) {
                    if tx.send(line[at + tag.len()..].to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        rx
    }

    /// Wait (within the watchdog) for a line of its standard output that starts with
    /// `prefix`; the line. Its later output is read and dropped.
    pub fn wait_line(&mut self, prefix: &str) -> String {
        let rx = self.tagged_lines("");
        let deadline = Instant::now() + WATCHDOG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(e) => panic!("watchdog: {} never printed a line starting {prefix:?} ({e})", self.what),
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The next line from `rx` (of [`Proc::tagged_lines`]) within the watchdog; it must be
/// `expected`.
pub fn expect_line(rx: &mpsc::Receiver<String>, expected: &str) {
    match rx.recv_timeout(WATCHDOG) {
        Ok(line) => assert_eq!(line, expected),
        Err(e) => panic!("watchdog: no {expected:?} from the child ({e})"),
    }
}

/// This test binary run again as a child in a named role: the child runs only the test
/// `test` (`--exact`), which asks [`Role::current`] and plays its part.
#[derive(Clone, Copy, Debug)]
pub struct Role {
    /// The environment variable that carries the role's name.
    pub env: &'static str,
}

/// The role of a test run by [`Role::alone`].
pub const ALONE: &str = "alone";

/// Carries the parent's pid to a role, which checks it after asking to die with it.
const PARENT_ENV: &str = "ICTUS_TESTKIT_PARENT";

impl Role {
    /// A command that runs this test binary's test `test` in `role`; standard input and
    /// output are null and standard error inherited unless the caller changes them.
    pub fn command(&self, test: &str, role: &str) -> Command {
        let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
        cmd.args(["--exact", test, "--nocapture", "--test-threads=1", "-q"])
            .env(self.env, role)
            .env(PARENT_ENV, std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        cmd
    }

    /// For a test that counts what the whole process holds (descriptors, mappings):
    /// whether to run its body here. A normal test run starts the test again in a child
    /// process of its own (role [`ALONE`]), where no other test of the binary runs beside
    /// it, waits for it (five watchdogs) and fails if it failed — beside other tests the
    /// counts move under it, and a process-wide resource another test happens to start
    /// first after the count (a watcher thread, a shared space's notifier) never goes
    /// away. In that child: true. In a child of another role: false.
    pub fn alone(&self, test: &str) -> bool {
        if let Some(role) = self.current() {
            return role == ALONE;
        }
        let mut cmd = self.command(test, ALONE);
        cmd.stdout(Stdio::inherit());
        let what = format!("{test}, alone in its own process");
        let mut child = Proc::spawn(&what, &mut cmd);
        let st = child.wait_within(WATCHDOG * 5);
        assert!(st.success(), "{what} failed: {st} (its output is above)");
        false
    }

    /// In a child started by [`Role::command`]: its role (after arranging to be killed
    /// when the parent dies, and exiting if the parent is already gone). In a normal
    /// test run: `None`, and the test returns at once.
    pub fn current(&self) -> Option<String> {
        let role = std::env::var(self.env).ok()?;
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)).expect("PDEATHSIG");
        let parent: i32 = std::env::var(PARENT_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        if rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get()) != parent {
            std::process::exit(3);
        }
        Some(role)
    }
}

/// A name server on a thread of the test, listening on `ns.sock` in a private
/// directory of its own. Stopped (socket removed) on drop; the directory stays until
/// then.
#[derive(Debug)]
pub struct NameServer {
    running: std::sync::Mutex<Option<ictus_name_server::Running>>,
    space: Space,
    service: Name,
    dir: TempDir,
}

impl NameServer {
    /// Start one; clients can connect when this returns.
    pub fn start() -> NameServer {
        let dir = TempDir::new("ns");
        let running = ictus_name_server::server::spawn(Space::new(), Some(&dir.join("ns.sock"))).expect("name server");
        let (space, service) = (running.space().clone(), running.service_port());
        NameServer { running: std::sync::Mutex::new(Some(running)), space, service, dir }
    }

    /// Its socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("ns.sock")
    }

    /// Its private directory (for other servers' sockets beside it).
    pub fn dir(&self) -> &TempDir {
        &self.dir
    }

    /// The space the server's rights live in.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// The service port's receive right in [`NameServer::space`].
    pub fn service_port(&self) -> Name {
        self.service
    }

    /// A client in `space`, with calls bounded by the watchdog.
    pub fn client(&self, space: &Space) -> ictus_name_server::Client {
        ictus_name_server::Client::connect_socket(space, &self.socket()).expect("connect").with_timeout(WATCHDOG)
    }

    /// Whether `name` is registered now.
    pub fn has(&self, name: &str) -> bool {
        let space = Space::new();
        let Ok(c) = ictus_name_server::Client::connect_socket(&space, &self.socket()) else { return false };
        c.list().is_ok_and(|l| l.iter().any(|n| n == name))
    }

    /// Wait (within the watchdog) until `name` is registered.
    pub fn wait_for(&self, name: &str) {
        wait_until(&format!("{name:?} to be registered"), || self.has(name));
    }

    /// Start a new name server on the same socket (after [`NameServer::stop`], or to
    /// replace one that was killed), as a restart would.
    pub fn restart(&self) {
        let mut running = self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        assert!(running.is_none(), "stop the name server before starting another on its socket");
        *running = Some(ictus_name_server::server::spawn(Space::new(), Some(&self.socket())).expect("name server"));
    }

    /// Stop it cleanly (it must end without an error); its directory stays.
    pub fn stop(&self) {
        let running = self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(r) = running {
            r.stop().expect("the name server stops cleanly");
        }
    }
}

impl Drop for NameServer {
    fn drop(&mut self) {
        let running = self.running.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(r) = running {
            let _ = r.stop();
        }
    }
}

/// A clock server on a thread of the test, its control socket beside a name server's
/// socket, its clock port registered with that name server as `"clock"` (and again
/// when it restarts). Stopped on drop.
#[derive(Debug)]
pub struct ClockServer {
    registrar: Option<Registrar>,
    running: Option<ictus_clock_server::Running>,
}

impl ClockServer {
    /// Start one, registered with `ns`.
    pub fn start(ns: &NameServer) -> ClockServer {
        let options = ictus_clock_server::server::Options {
            control_socket: Some(ns.dir().join(unique("clock-control") + ".sock")),
            setup: None,
        };
        let running = ictus_clock_server::server::spawn(Space::new(), options).expect("clock server");
        let registrar = Registrar::start(
            "clock-server",
            Some(&ns.socket()),
            running.space(),
            &[(ictus_clock_server::protocol::SERVICE_NAME, running.clock_port())],
        )
        .expect("register the clock");
        ClockServer { registrar: Some(registrar), running: Some(running) }
    }

    /// The running server.
    pub fn running(&self) -> &ictus_clock_server::Running {
        self.running.as_ref().expect("running")
    }

    /// Stop it cleanly (unregistering first).
    pub fn stop(mut self) {
        self.stop_inner().expect("the clock server stops cleanly");
    }

    fn stop_inner(&mut self) -> Result<(), ictus_server::ServeError> {
        if let Some(r) = self.registrar.take() {
            r.stop();
        }
        self.running.take().map_or(Ok(()), ictus_clock_server::Running::stop)
    }
}

impl Drop for ClockServer {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// A MIDI input server on a thread of the test, reading a virtual cable of its own,
/// timesharing, registered with a name server under `name` (again when it restarts).
/// Stopped on drop.
#[derive(Debug)]
pub struct MidiServer {
    registrar: Option<Registrar>,
    running: Option<ictus_midi_server::Running>,
    cable: String,
    name: String,
}

impl MidiServer {
    /// Start one, on a fresh cable, registered with `ns` under a fresh name.
    pub fn start(ns: &NameServer) -> MidiServer {
        let cable = unique("cable");
        let name = format!("midi-{cable}");
        let dev = ictus_midi::device::cable::CableIn::open(&cable).expect("cable");
        let options = ictus_midi_server::Options::timesharing();
        let running = ictus_midi_server::server::spawn(Space::new(), Box::new(dev), &options).expect("MIDI server");
        let registrar =
            Registrar::start("midi-server", Some(&ns.socket()), running.space(), &[(&name, running.service_port())])
                .expect("register the MIDI server");
        MidiServer { registrar: Some(registrar), running: Some(running), cable, name }
    }

    /// The running server.
    pub fn running(&self) -> &ictus_midi_server::Running {
        self.running.as_ref().expect("running")
    }

    /// The cable it reads.
    pub fn cable(&self) -> &str {
        &self.cable
    }

    /// The name it is registered under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stop it cleanly (unregistering first).
    pub fn stop(mut self) {
        self.stop_inner().expect("the MIDI server stops cleanly");
    }

    fn stop_inner(&mut self) -> Result<(), ictus_server::ServeError> {
        if let Some(r) = self.registrar.take() {
            r.stop();
        }
        self.running.take().map_or(Ok(()), ictus_midi_server::Running::stop)
    }
}

impl Drop for MidiServer {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// `ictus name-server --socket PATH` (the binary `ictus`), its standard error in a log
/// beside the socket ([`Proc::log`]), started and not waited for.
pub fn spawn_ictus_name_server(ictus: &Path, socket: &Path) -> Proc {
    static N: AtomicUsize = AtomicUsize::new(0);
    let log = socket.with_file_name(format!("name-server-{}.log", N.fetch_add(1, Ordering::Relaxed)));
    Proc::spawn_logged("ictus name-server", Command::new(ictus).arg("name-server").arg("--socket").arg(socket), &log)
}

/// [`spawn_ictus_name_server`], once its socket answers (within the watchdog).
pub fn ictus_name_server(ictus: &Path, socket: &Path) -> Proc {
    let mut p = spawn_ictus_name_server(ictus, socket);
    let deadline = Instant::now() + WATCHDOG;
    loop {
        if ictus_name_server::Client::connect_socket(&Space::new(), socket).is_ok() {
            return p;
        }
        if let Some(st) = p.try_wait() {
            panic!("the name server exited early ({st}); its log:\n{}", p.log());
        }
        assert!(Instant::now() < deadline, "watchdog: the name server never answered; its log:\n{}", p.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A send right in `space` to the name `name`, looked up with the name server at
/// `socket`, once it is registered (within the watchdog).
pub fn lookup_when_registered(space: &Space, socket: &Path, name: &str) -> Name {
    let deadline = Instant::now() + WATCHDOG;
    loop {
        if let Ok(c) = ictus_name_server::Client::connect_socket(space, socket) {
            if let Ok(right) = c.lookup(name) {
                return right;
            }
        }
        assert!(Instant::now() < deadline, "watchdog: {name:?} was never registered");
        std::thread::sleep(Duration::from_millis(10));
    }
}
