//! The clock server: an alarm queue, a timer, and the two ports.
//!
//! It is written on the server skeleton ([`ictus_server::Loop`]): one thread polls the
//! stop channel, a port set (the clock port, the control port and the notify port), a
//! `timerfd` armed with `TFD_TIMER_ABSTIME` on `CLOCK_MONOTONIC` for the queue's next
//! deadline, and, when it has one, the control socket ([`crate::control`]). Requests on the clock port go to a generated
//! [`ClockServer`]; requests on the control port to one that answers [`ClockControl`]
//! too, so a control request on the clock port is `MIG_BAD_ID`. [`Clock::sleep`] is
//! intercepted before the generated code: the server keeps the reply right in the queue
//! and answers when the time comes.
//!
//! # Rights and references
//!
//! Every pending alarm holds the user reference of its port's right that the request
//! brought (send rights to the same port coalesce to one name with several references;
//! each send-once right has a name of its own); every pending sleep holds its reply
//! right. For each such name the server arms one dead-name request (a count per name,
//! cancelled when the last entry for it goes), so that a client that dies — even by
//! `kill -9` — has its alarms and sleeps removed from the queue when the kernel closes
//! its connections, not when they come due. Sending an alarm to a port that turns out
//! to be dead does the same at once. Alarm messages and sleep replies are sent without
//! waiting (a full queue drops the alarm and counts it), so no client can stall the
//! clock.
//!
//! # Quotas
//!
//! Pending alarms and sleeps are counted per client, a client being the
//! kernel-verified pid of the request's sender; over its quota a request is refused
//! with [`ClockError::QuotaExceeded`], and the whole queue holds at most
//! [`MAX_PENDING`].

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ictus_abi::Name;
use ictus_idl::{Context, Decode, Dispatched, Encode, Encoder, Outcome, Service};
use ictus_ipc::{Credentials, Received, ReceivedRight, RightKind, RightsError, SendError, SendOptions, Space};
use ictus_rt::{clock, AlarmId, AlarmQueue, Time};
use ictus_server::{DeadNameWatches, Door, Listener, Loop, Serve, ServicePorts, Wait, SMALL_REQUESTS};

use crate::protocol::{
    AlarmMessage, AlarmPort, Clock, ClockControl, ClockControlServer, ClockError, ClockServer, ClockStats, WireTime,
    WireWhen, DEFAULT_CLIENT_QUOTA, MAX_CLIENT_QUOTA, MAX_PENDING, MAX_RESOLUTION, SLEEP,
};

pub use ictus_server::ServeError;

/// How long before a deadline the server wakes by default ([`Server::set_lead`]):
/// 100 µs, about the 99th percentile of its own timer's wake-up lateness outside the
/// host's stalls on the shared test machine, so that the alarm is sent within a few
/// microseconds of its time (`doc/clock.md`, *The server wakes ahead*). It costs up to
/// 100 µs of the server's CPU per deadline (1 % at 100 alarms a second).
pub const DEFAULT_LEAD: Duration = Duration::from_micros(100);
/// The longest lead [`Server::set_lead`] takes.
pub const MAX_LEAD: Duration = Duration::from_millis(1);

/// What waits in the queue.
#[derive(Debug)]
enum Pending {
    /// An alarm message to send.
    Alarm { port: Name, kind: RightKind, owner: Credentials, tag: u64, requested: Time },
    /// A sleeping client's reply.
    Sleep { reply: ReceivedRight, owner: Credentials },
}

impl Pending {
    fn right(&self) -> Name {
        match self {
            Pending::Alarm { port, .. } => *port,
            Pending::Sleep { reply, .. } => reply.name,
        }
    }

    fn owner(&self) -> Credentials {
        match self {
            Pending::Alarm { owner, .. } | Pending::Sleep { owner, .. } => *owner,
        }
    }
}

/// The queue and everything counted beside it.
#[derive(Debug)]
struct Table {
    queue: AlarmQueue<Pending>,
    /// Pending entries per client pid.
    per_client: HashMap<u32, u32>,
    /// Armed dead-name requests: entries per right name.
    watched: DeadNameWatches,
    quota: u32,
    alarms_sent: u64,
    alarms_dropped: u64,
    sleeps_answered: u64,
}

impl Table {
    fn admit(&self, pid: u32) -> Result<(), ClockError> {
        if self.queue.len() >= MAX_PENDING {
            return Err(ClockError::Full);
        }
        if self.per_client.get(&pid).copied().unwrap_or(0) >= self.quota {
            return Err(ClockError::QuotaExceeded);
        }
        Ok(())
    }

    fn charge(&mut self, pid: u32) {
        *self.per_client.entry(pid).or_insert(0) += 1;
    }

    fn refund(&mut self, pid: u32) {
        if let Some(n) = self.per_client.get_mut(&pid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_client.remove(&pid);
            }
        }
    }

    fn stats(&self) -> ClockStats {
        let sleeps = self.queue.iter().filter(|(_, _, p)| matches!(p, Pending::Sleep { .. })).count() as u64;
        ClockStats {
            pending_alarms: self.queue.len() as u64 - sleeps,
            pending_sleeps: sleeps,
            alarms_sent: self.alarms_sent,
            alarms_dropped: self.alarms_dropped,
            sleeps_answered: self.sleeps_answered,
            clients: self.per_client.len() as u64,
            client_quota: self.quota,
            resolution: WireTime::from_duration(self.queue.resolution()),
        }
    }
}

/// The server's state, shared by the generated services and the server's own loop. Only
/// the server's thread touches it; the lock is what lets both hold it.
#[derive(Debug)]
struct State {
    space: Space,
    notify: Name,
    control: Name,
    table: Mutex<Table>,
}

impl State {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_dead(&self, right: Name) -> bool {
        match self.space.right_kinds(right) {
            Ok(k) => k.contains(&RightKind::DeadName),
            Err(_) => true,
        }
    }

    /// The port behind `right` died: drop every entry that uses it, and the dead name.
    fn purge(&self, t: &mut Table, right: Name) {
        let removed = t.queue.remove_if(|p| p.right() == right);
        for (_, p) in &removed {
            t.refund(p.owner().pid);
            if matches!(p, Pending::Alarm { .. }) {
                t.alarms_dropped += 1;
            }
        }
        t.watched.forget(&self.space, right);
        if self.is_dead(right) {
            let _ = self.space.destroy(right);
        } else {
            for _ in &removed {
                let _ = self.space.deallocate(right);
            }
        }
    }

    /// Release a pending entry that will not be carried out (cancelled, or the server
    /// stopping): its dead-name count, its right.
    fn release(&self, t: &mut Table, p: Pending) {
        t.refund(p.owner().pid);
        let right = p.right();
        t.watched.unwatch(&self.space, right);
        let _ = self.space.deallocate(right);
    }

    /// Carry out everything due at `now`.
    fn fire(&self, now: Time) {
        let mut t = self.table();
        let due = t.queue.pop_due(now);
        for (id, p) in due {
            t.refund(p.owner().pid);
            match p {
                Pending::Alarm { port, kind, tag, requested, .. } => {
                    let msg = AlarmMessage { alarm: id.as_raw(), tag, requested, sent: clock::now() };
                    // The watch goes before the right is used up or released.
                    t.watched.unwatch(&self.space, port);
                    let sent =
                        self.space.send(port, &mut msg.to_message(), SendOptions { timeout: Some(Duration::ZERO) });
                    match sent {
                        Ok(()) => t.alarms_sent += 1,
                        Err(_) => t.alarms_dropped += 1,
                    }
                    // A send right keeps its reference after a send; a send-once right
                    // is used up by one that went.
                    if kind == RightKind::Send || sent.is_err() {
                        let _ = self.space.deallocate(port);
                    }
                    if matches!(sent, Err(SendError::InvalidDest(_))) {
                        // The port died: its other alarms go too, and the dead name.
                        self.purge(&mut t, port);
                    }
                }
                Pending::Sleep { reply, .. } => {
                    t.watched.unwatch(&self.space, reply.name);
                    let mut enc = Encoder::new(ictus_idl::reply_id(SLEEP));
                    let encoded =
                        0u32.encode(&mut enc).and_then(|()| WireTime::from_time(clock::now()).encode(&mut enc));
                    let sent = encoded.is_ok()
                        && self
                            .space
                            .send(reply.name, &mut enc.into_message(), SendOptions { timeout: Some(Duration::ZERO) })
                            .is_ok();
                    if sent {
                        t.sleeps_answered += 1;
                    }
                    if !sent || reply.kind != RightKind::SendOnce {
                        let _ = self.space.deallocate(reply.name);
                    }
                }
            }
        }
    }

    /// A dead-name notification named `name`.
    fn dead_name(&self, name: Name) {
        if self.space.right_kinds(name).is_ok_and(|k| k == [RightKind::DeadName]) {
            self.purge(&mut self.table(), name);
        }
    }

    /// A sleep request, with its reply deferred until it is due.
    fn sleep_request(&self, req: &mut Received) -> Outcome {
        if req.reply.is_none() {
            return Outcome::BadRequest(ictus_idl::DecodeError::NoReplyRight);
        }
        let when = {
            let mut dec = ictus_idl::Decoder::new(req);
            WireWhen::decode(&mut dec).and_then(|w| dec.finish().map(|()| w))
        };
        let when = match when {
            Ok(w) => w,
            Err(e) => return Outcome::BadRequest(e),
        };
        let arrival = clock::now();
        let when = match when.to_when() {
            Ok(w) => w,
            Err(e) => return ictus_idl::reply::<WireTime, ClockError>(req, SLEEP, Err(e)),
        };
        let at = when.resolve(arrival);
        let mut t = self.table();
        if let Err(e) = t.admit(req.sender.pid) {
            return ictus_idl::reply::<WireTime, ClockError>(req, SLEEP, Err(e));
        }
        if at.round_up(t.queue.resolution()) <= arrival {
            t.sleeps_answered += 1;
            return ictus_idl::reply::<WireTime, ClockError>(req, SLEEP, Ok(WireTime::from_time(clock::now())));
        }
        let Some(reply) = req.reply.take() else {
            return Outcome::BadRequest(ictus_idl::DecodeError::NoReplyRight);
        };
        let owner = req.sender;
        // Best effort: a reply right that cannot be watched is still answered when due.
        let _ = t.watched.watch(&self.space, reply.name, self.notify).map_err(|_| ClockError::DeadPort);
        match t.queue.insert(at, Pending::Sleep { reply, owner }) {
            Ok(_) => {
                t.charge(owner.pid);
                Outcome::OneWay
            }
            Err(e) => {
                let Pending::Sleep { reply, .. } = e.into_payload() else { unreachable!("a sleep came back") };
                t.watched.unwatch(&self.space, reply.name);
                req.reply = Some(reply);
                ictus_idl::reply::<WireTime, ClockError>(req, SLEEP, Err(ClockError::Full))
            }
        }
    }

    fn set_alarm_inner(
        &self,
        t: &mut Table,
        sender: Credentials,
        when: WireWhen,
        port: AlarmPort,
        tag: u64,
    ) -> Result<(u64, WireTime), ClockError> {
        let arrival = clock::now();
        let at = when.to_when()?.resolve(arrival);
        t.admit(sender.pid)?;
        let name = port.name();
        if self.is_dead(name) {
            return Err(ClockError::DeadPort);
        }
        t.watched.watch(&self.space, name, self.notify).map_err(|_| ClockError::DeadPort)?;
        let pending = Pending::Alarm { port: name, kind: port.kind(), owner: sender, tag, requested: at };
        match t.queue.insert(at, pending) {
            Ok(id) => {
                t.charge(sender.pid);
                Ok((id.as_raw(), WireTime::from_time(at)))
            }
            Err(_) => {
                t.watched.unwatch(&self.space, name);
                Err(ClockError::Full)
            }
        }
    }

    fn release_all(&self) {
        let mut t = self.table();
        let all = t.queue.remove_if(|_| true);
        for (_, p) in all {
            self.release(&mut t, p);
        }
    }
}

/// The interface's methods, on the shared state.
#[derive(Debug)]
struct Methods(Arc<State>);

impl std::ops::Deref for Methods {
    type Target = State;
    fn deref(&self) -> &State {
        &self.0
    }
}

/// The clock port's methods. Rights a request brings belong to the method: an alarm's
/// port is kept while the alarm is pending and released when it is refused.
impl Clock for Methods {
    fn read(&self) -> Result<(WireTime, WireTime), ClockError> {
        Ok((WireTime::from_time(clock::now()), WireTime::from_time(clock::wall())))
    }

    fn sleep(&self, _cx: &Context, _when: WireWhen) -> Result<WireTime, ClockError> {
        // Reached only without the server's loop, which defers the reply.
        Err(ClockError::NotHere)
    }

    fn set_alarm(
        &self,
        cx: &Context,
        when: WireWhen,
        port: AlarmPort,
        tag: u64,
    ) -> Result<(u64, WireTime), ClockError> {
        let mut t = self.table();
        let result = self.set_alarm_inner(&mut t, cx.sender, when, port, tag);
        if result.is_err() {
            let _ = self.space.deallocate(port.name());
        }
        result
    }

    fn cancel_alarm(&self, cx: &Context, alarm: u64) -> Result<(), ClockError> {
        let mut t = self.table();
        let id = AlarmId::from_raw(alarm);
        let owner = match t.queue.get(id) {
            Some((_, Pending::Alarm { owner, .. })) => *owner,
            // Sleeps have ids in the same sequence but are not alarms.
            _ => return Err(ClockError::NoSuchAlarm),
        };
        let by_owner = owner.pid == cx.sender.pid && owner.uid == cx.sender.uid;
        if !by_owner && cx.port != self.control {
            return Err(ClockError::NotOwner);
        }
        if let Some(p) = t.queue.cancel(id) {
            self.release(&mut t, p);
        }
        Ok(())
    }

    fn resolution(&self) -> Result<WireTime, ClockError> {
        Ok(WireTime::from_duration(self.table().queue.resolution()))
    }
}

impl ClockControl for Methods {
    fn set_resolution(&self, resolution: WireTime) -> Result<WireTime, ClockError> {
        let d = resolution.to_duration()?;
        if d > MAX_RESOLUTION {
            return Err(ClockError::BadResolution);
        }
        let mut t = self.table();
        let previous = t.queue.resolution();
        t.queue.set_resolution(d);
        Ok(WireTime::from_duration(previous))
    }

    fn stats(&self) -> Result<ClockStats, ClockError> {
        Ok(self.table().stats())
    }

    fn set_client_quota(&self, quota: u32) -> Result<u32, ClockError> {
        if !(1..=MAX_CLIENT_QUOTA).contains(&quota) {
            return Err(ClockError::BadResolution);
        }
        let mut t = self.table();
        Ok(std::mem::replace(&mut t.quota, quota))
    }
}

/// The generated [`ClockServer`], with [`Clock::sleep`] taken aside so that its reply
/// can wait.
struct ClockService {
    state: Arc<State>,
    generated: ClockServer<Methods>,
}

impl Service for ClockService {
    fn ids(&self) -> RangeInclusive<i32> {
        self.generated.ids()
    }

    fn dispatch(&self, space: &Space, req: &mut Received) -> Outcome {
        if req.id == SLEEP {
            return self.state.sleep_request(req);
        }
        self.generated.dispatch(space, req)
    }
}

/// A shared view of a server's counters, usable from other threads.
#[derive(Clone, Debug)]
pub struct StatsHandle(Arc<State>);

impl StatsHandle {
    /// The counters now.
    pub fn stats(&self) -> ClockStats {
        self.0.table().stats()
    }
}

/// What the skeleton runs: the queue, the timer, and a demultiplexer per port.
#[derive(Debug)]
pub struct Core {
    state: Arc<State>,
    clock_requests: ictus_idl::Server,
    control_requests: ictus_idl::Server,
    timer: ictus_clock_api::timer::Timer,
    /// How long before a deadline the timer wakes the server ([`Server::set_lead`]).
    lead: Duration,
}

impl Serve for Core {
    const NAME: &'static str = "clock-server";

    fn request(&mut self, msg: &mut Received) -> Dispatched {
        if msg.port == self.state.control {
            self.control_requests.handle(msg)
        } else {
            self.clock_requests.handle(msg)
        }
    }

    fn dead_name(&mut self, name: Name) {
        self.state.dead_name(name);
    }

    fn prepare(&mut self) -> Result<Wait, ServeError> {
        // Woken `lead` before the next deadline, so that a late wake-up of up to
        // `lead` costs the alarm nothing ([`Server::set_lead`]).
        let next = self.state.table().queue.next_deadline();
        self.timer.arm(next.map(|t| t.saturating_sub(self.lead))).map_err(|e| ServeError::setup("timer", e))?;
        Ok(Wait::Until(None))
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.timer.as_fd()]
    }

    fn ready(&mut self, _timer: usize) -> Result<(), ServeError> {
        // Woken ahead of the deadline (by at most `lead`): wait for it on the clock,
        // awake, and send at the time, never before.
        let next = self.state.table().queue.next_deadline();
        let mut now = clock::now();
        if let Some(due) = next.filter(|&due| due > now && due.saturating_duration_since(now) <= self.lead) {
            while now < due {
                std::hint::spin_loop();
                now = clock::now();
            }
        }
        // What is due goes first; the timer's expiry count is read after, off the
        // alarms' path (one system call less between the wake-up and the send; the
        // count only has to be read before the next wait).
        self.state.fire(now);
        self.timer.clear();
        Ok(())
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // Pending rights first (sleepers see their call fail when the reply rights go);
        // the ports go with the loop afterwards.
        self.state.release_all();
    }
}

/// The clock server: its ports, its queue and its timer. See the module documentation.
#[derive(Debug)]
pub struct Server {
    inner: Loop<Core, 2>,
}

impl Server {
    /// A server with its ports allocated in `space` (the process's own,
    /// [`Space::task`], for a real server).
    pub fn new(space: Space) -> Result<Server, ServeError> {
        let ports = ServicePorts::allocate(&space)?;
        ports.set_message_limit(SMALL_REQUESTS)?;
        let table = Table {
            queue: AlarmQueue::new(MAX_PENDING),
            per_client: HashMap::new(),
            watched: DeadNameWatches::new(),
            quota: DEFAULT_CLIENT_QUOTA,
            alarms_sent: 0,
            alarms_dropped: 0,
            sleeps_answered: 0,
        };
        let state = Arc::new(State {
            space: space.clone(),
            notify: ports.notify(),
            control: ports.service(1),
            table: Mutex::new(table),
        });
        let service =
            || ClockService { state: Arc::clone(&state), generated: ClockServer(Methods(Arc::clone(&state))) };
        // Replies never wait: a client that stops reading must not stall the clock.
        let clock_requests =
            ictus_idl::Server::new(&space, ports.set()).with(service()).with_reply_timeout(Duration::ZERO);
        let control_requests = ictus_idl::Server::new(&space, ports.set())
            .with(service())
            .with(ClockControlServer(Methods(Arc::clone(&state))))
            .with_reply_timeout(Duration::ZERO);
        let timer = ictus_clock_api::timer::Timer::new().map_err(|e| ServeError::setup("timer", e))?;
        let core = Core { state, clock_requests, control_requests, timer, lead: DEFAULT_LEAD };
        Ok(Server { inner: Loop::new(&space, ports, core) })
    }

    /// The space the server's rights live in.
    pub fn space(&self) -> &Space {
        self.inner.space()
    }

    /// Wake this long before each deadline and wait for it awake, sending what is due
    /// at its time, never before ([`DEFAULT_LEAD`] unless set; at most [`MAX_LEAD`]).
    /// A late wake-up of up to `lead` then costs the alarms nothing, at the price of up
    /// to `lead` of this thread's CPU time per deadline. Zero: wake at the deadline.
    pub fn set_lead(&mut self, lead: Duration) {
        self.inner.server_mut().lead = lead.min(MAX_LEAD);
    }

    /// How long before each deadline the server wakes.
    pub fn lead(&self) -> Duration {
        self.inner.server().lead
    }

    /// The clock port's receive right, in [`Server::space`].
    pub fn clock_port(&self) -> Name {
        self.inner.ports().service(0)
    }

    /// The clock-control port's receive right, in [`Server::space`].
    pub fn control_port(&self) -> Name {
        self.inner.ports().service(1)
    }

    /// The counters.
    pub fn stats(&self) -> ClockStats {
        self.inner.server().state.table().stats()
    }

    /// A handle to the counters for other threads.
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle(Arc::clone(&self.inner.server().state))
    }

    /// Malformed messages received (and destroyed by the nucleus) so far.
    pub fn malformed(&self) -> u64 {
        self.inner.malformed()
    }

    /// Serve until `stop` becomes readable (a byte written, or its peer closed): ports,
    /// the timer, and the control socket if there is one.
    pub fn run(&mut self, control: Option<&Listener>, stop: BorrowedFd<'_>) -> Result<(), ServeError> {
        self.inner.run(control.map(|listener| Door { listener, port: 1 }), stop)
    }

    /// Receive and handle up to `max` messages that are already waiting; returns how
    /// many were handled.
    pub fn handle_pending(&mut self, rcv: &mut Received, max: usize) -> Result<usize, ServeError> {
        self.inner.handle_pending(rcv, max)
    }

    /// Handle one received message: a notification on the notify port, a request on
    /// the clock or control port.
    pub fn handle(&mut self, msg: &mut Received) -> Dispatched {
        self.inner.handle(msg)
    }
}

/// How [`spawn`] starts a server.
#[derive(Default)]
pub struct Options {
    /// Hand the control port out on this socket ([`crate::control`]).
    pub control_socket: Option<PathBuf>,
    /// Run on the server thread before serving (for example, to raise its priority).
    pub setup: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("control_socket", &self.control_socket)
            .field("setup", &self.setup.as_ref().map(|_| "…"))
            .finish()
    }
}

/// A server running on a thread of this process (for tests, benchmarks, and programs
/// that embed one). Dropping it stops the server.
#[derive(Debug)]
#[must_use = "dropping a Running stops the server"]
pub struct Running {
    inner: ictus_server::Running,
    space: Space,
    clock: Name,
    control: Name,
    stats: StatsHandle,
    path: Option<PathBuf>,
}

/// Start a server on a new thread, its ports in `space`. When this returns the control
/// socket (if any) is listening.
pub fn spawn(space: Space, options: Options) -> Result<Running, ServeError> {
    let listener = options.control_socket.as_deref().map(|p| Listener::bind(p, "clock server")).transpose()?;
    let mut server = Server::new(space.clone())?;
    let (clock, control, stats) = (server.clock_port(), server.control_port(), server.stats_handle());
    let setup = options.setup;
    let inner = ictus_server::Running::spawn("ictus-clock-server", move |stop| {
        if let Some(f) = setup {
            f();
        }
        let r = server.run(listener.as_ref(), stop);
        drop(server);
        drop(listener);
        r
    })?;
    Ok(Running { inner, space, clock, control, stats, path: options.control_socket })
}

impl Running {
    /// The space the server's rights live in.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// The clock port's receive right in [`Running::space`].
    pub fn clock_port(&self) -> Name {
        self.clock
    }

    /// The control port's receive right in [`Running::space`].
    pub fn control_port(&self) -> Name {
        self.control
    }

    /// The control socket, if the server listens on one.
    pub fn control_socket(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// A new send right to the clock port, as a descriptor (for
    /// [`Space::insert_send_fd`]).
    pub fn clock_fd(&self) -> Result<OwnedFd, RightsError> {
        self.space.send_right_fd(self.clock)
    }

    /// A new send right to the control port, as a descriptor.
    pub fn control_fd(&self) -> Result<OwnedFd, RightsError> {
        self.space.send_right_fd(self.control)
    }

    /// The counters now.
    pub fn stats(&self) -> ClockStats {
        self.stats.stats()
    }

    /// Stop the server, wait for its thread, and report how it ended. Its ports die
    /// (sleeping clients' calls fail with `ServerDied`) and its socket path is removed.
    pub fn stop(self) -> Result<(), ServeError> {
        self.inner.stop()
    }
}
