//! Library input (000 §4.6): a handle that receives MIDI from the input server, with
//! the paper's two calls, [`Input::get`] for normal messages and [`Input::getx`] for
//! system exclusive, each blocking or not.
//!
//! A handle subscribes a port of its own for each class it wants, so the two calls
//! never wait on each other and any number of handles live in one process, each with
//! its own ports. (The paper's library had one input thread per process that received
//! every message and sorted it into the right `mi_id`'s queue; here the nucleus's
//! ports are the queues, and a receive on the right port is the sorting.)
//!
//! A server that dies — even by `kill -9` — is an error, not a hang: each port asks
//! for a **no-senders** notification once the server holds the only send right to it,
//! so when the server's rights go, the kernel hangs up the connection, the nucleus
//! sends the notification to the port itself, and the blocked `get` returns
//! [`InputError::ServerDied`].
//!
//! Every delivery is checked ([`Delivery::parse`]) and must come from the server's
//! kernel-verified pid; anything else is refused, its rights released, and counted.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use ictus_abi::{Name, NotifyId};
use ictus_idl::SendRight;
use ictus_ipc::{Disposition, NotifyKind, PortArg, ReceiveError, ReceiveOptions, Received, RightKind, Space};
use ictus_midi::Message;

use crate::protocol::{Class, Delivery, InputStats, MidiError, MidiInputClient, SERVICE_NAME};

/// How long a request to the server may take by default (generous: only a wedged
/// server turns into an error; a dead one is seen at once).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The queue limit of a handle's ports, in messages.
pub const QUEUE_LIMIT: u32 = 1024;

/// Why a handle could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The name server could not be reached.
    #[error("cannot find the MIDI input server: {0}")]
    NameServer(#[from] ictus_name_api::ConnectError),
    /// The name is not registered (no input server is running).
    #[error("{}", lookup_message(name, source))]
    Lookup {
        /// The name.
        name: String,
        /// Why.
        source: ictus_name_api::ClientError,
    },
    /// A port could not be made or arranged.
    #[error("making the handle's ports: {0}")]
    Rights(#[from] ictus_ipc::RightsError),
    /// The server refused or could not be reached.
    #[error("subscribing to {class:?} messages: {source}")]
    Subscribe {
        /// The class.
        class: Class,
        /// Why.
        source: ictus_idl::ClientError<MidiError>,
    },
    /// Neither class was asked for.
    #[error("a MIDI input handle needs at least one class (normal or sysex)")]
    NoClass,
}

fn lookup_message(name: &str, e: &ictus_name_api::ClientError) -> String {
    match e {
        ictus_name_api::ClientError::NotFound(_) => {
            format!("no MIDI input server is registered with the name server as {name:?}; start one with `ictus midi-server`")
        }
        e => format!("cannot look up the MIDI input server ({name:?}) with the name server: {e}"),
    }
}

/// Why an input call failed.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The server died or stopped delivering (its rights to our port are gone).
    #[error("the MIDI input server died or dropped this handle")]
    ServerDied,
    /// This handle did not subscribe to the class.
    #[error("this handle is not subscribed to {0:?} messages")]
    NotSubscribed(Class),
    /// Receiving failed.
    #[error("receiving MIDI input: {0}")]
    Receive(ReceiveError),
}

/// Why a request to the server failed.
pub type RequestError = ictus_idl::ClientError<MidiError>;

/// What a handle has counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandleStats {
    /// Messages returned by `get`.
    pub normal: u64,
    /// Messages returned by `getx`.
    pub sysex: u64,
    /// Messages the server could not deliver to us (gaps in its sequence numbers).
    pub lost: u64,
    /// Messages refused: not from the server, or not a valid delivery.
    pub refused: u64,
    /// Sysex data bytes the server dropped (over its bound).
    pub sysex_overflow: u64,
}

/// One class's port and receive state.
#[derive(Debug)]
struct Sub {
    class: Class,
    port: Name,
    id: u64,
    rcv: Mutex<(Received, u64)>,
    dead: AtomicBool,
}

/// A MIDI input handle (the input side of the paper's `mi_id`).
#[derive(Debug)]
pub struct Input {
    space: Space,
    stubs: MidiInputClient,
    server_pid: u32,
    subs: Vec<Sub>,
    normal: AtomicU64,
    sysex: AtomicU64,
    lost: AtomicU64,
    refused: AtomicU64,
    sysex_overflow: AtomicU64,
}

impl Input {
    /// Open a handle on the input server registered as [`SERVICE_NAME`], found through
    /// the name server (its socket `name_server`, or the default one).
    pub fn connect(space: &Space, name_server: Option<&Path>, normal: bool, sysex: bool) -> Result<Input, OpenError> {
        Input::connect_named(space, name_server, SERVICE_NAME, normal, sysex)
    }

    /// As [`Input::connect`], for a server registered under `name`.
    pub fn connect_named(
        space: &Space,
        name_server: Option<&Path>,
        name: &str,
        normal: bool,
        sysex: bool,
    ) -> Result<Input, OpenError> {
        let ns = match name_server {
            Some(p) => ictus_name_api::Client::connect_socket(space, p)?,
            None => ictus_name_api::Client::connect(space)?,
        };
        let server = ns.lookup(name).map_err(|source| OpenError::Lookup { name: name.to_owned(), source })?;
        Input::open(space, server, normal, sysex)
    }

    /// Open a handle on the server whose send right `server` this space holds (the
    /// handle takes over one user reference of it), for normal messages, system
    /// exclusive, or both.
    pub fn open(space: &Space, server: Name, normal: bool, sysex: bool) -> Result<Input, OpenError> {
        let stubs = MidiInputClient::new(space, server).with_timeout(DEFAULT_TIMEOUT);
        let mut input = Input {
            space: space.clone(),
            stubs,
            server_pid: 0,
            subs: Vec::new(),
            normal: AtomicU64::new(0),
            sysex: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            sysex_overflow: AtomicU64::new(0),
        };
        if !normal && !sysex {
            return Err(OpenError::NoClass);
        }
        for (want, class) in [(normal, Class::Normal), (sysex, Class::Sysex)] {
            if !want {
                continue;
            }
            let port = space.allocate_port()?;
            // Dropping `input` on an error below destroys the port.
            input.subs.push(Sub {
                class,
                port,
                id: 0,
                rcv: Mutex::new((Received::new(), 0)),
                dead: AtomicBool::new(false),
            });
            let _ = space.set_qlimit(port, QUEUE_LIMIT);
            let (pid, id) = input
                .stubs
                .subscribe(class.to_wire(), SendRight::make(port))
                .map_err(|source| OpenError::Subscribe { class, source })?;
            input.server_pid = pid;
            if let Some(s) = input.subs.last_mut() {
                s.id = id;
            }
            // The server now holds the only send right: when it goes, we hear of it.
            space.request_notification(
                port,
                NotifyKind::NoSenders,
                Some(PortArg::new(port, Disposition::MakeSendOnce)),
            )?;
        }
        Ok(input)
    }

    /// The next normal message (channel, system common, real-time); with `block`,
    /// waits for one, else `Ok(None)` if none is queued.
    pub fn get(&self, block: bool) -> Result<Option<Message>, InputError> {
        self.receive(Class::Normal, if block { None } else { Some(Duration::ZERO) })
    }

    /// The next system-exclusive message; with `block`, waits for one.
    pub fn getx(&self, block: bool) -> Result<Option<Message>, InputError> {
        self.receive(Class::Sysex, if block { None } else { Some(Duration::ZERO) })
    }

    /// The next message of `class`, waiting at most `timeout` (`None`: for ever);
    /// `Ok(None)` if none came in time.
    pub fn receive(&self, class: Class, timeout: Option<Duration>) -> Result<Option<Message>, InputError> {
        let sub = self.subs.iter().find(|s| s.class == class).ok_or(InputError::NotSubscribed(class))?;
        if sub.dead.load(Ordering::SeqCst) {
            return Err(InputError::ServerDied);
        }
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let mut guard = sub.rcv.lock().unwrap_or_else(PoisonError::into_inner);
        let (rcv, next_seq) = &mut *guard;
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            let opts = ReceiveOptions { timeout: left, ..ReceiveOptions::default() };
            match self.space.receive(sub.port, rcv, opts) {
                Ok(()) => {}
                Err(ReceiveError::TimedOut) => return Ok(None),
                Err(ReceiveError::Malformed { .. }) => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err(ReceiveError::PortDied) => return Err(InputError::ServerDied),
                Err(e) => return Err(InputError::Receive(e)),
            }
            let me = std::process::id();
            if rcv.sender.pid == me && rcv.id == NotifyId::NoSenders.id() {
                ictus_idl::release_rights(&self.space, rcv);
                sub.dead.store(true, Ordering::SeqCst);
                return Err(InputError::ServerDied);
            }
            if rcv.sender.pid != self.server_pid {
                ictus_idl::release_rights(&self.space, rcv);
                self.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match Delivery::parse(rcv) {
                Ok(d) if d.class == class => {
                    rcv.ool.clear();
                    if d.seq > *next_seq {
                        self.lost.fetch_add(d.seq - *next_seq, Ordering::Relaxed);
                    }
                    *next_seq = d.seq.wrapping_add(1);
                    match class {
                        Class::Normal => self.normal.fetch_add(1, Ordering::Relaxed),
                        Class::Sysex => self.sysex.fetch_add(1, Ordering::Relaxed),
                    };
                    self.sysex_overflow.fetch_add(d.overflow, Ordering::Relaxed);
                    return Ok(Some(d.message));
                }
                _ => {
                    ictus_idl::release_rights(&self.space, rcv);
                    self.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// What this handle has counted.
    pub fn stats(&self) -> HandleStats {
        HandleStats {
            normal: self.normal.load(Ordering::Relaxed),
            sysex: self.sysex.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            sysex_overflow: self.sysex_overflow.load(Ordering::Relaxed),
        }
    }

    /// The server's pid, as it told us (and as the kernel confirms on deliveries).
    pub fn server_pid(&self) -> u32 {
        self.server_pid
    }

    /// The port `class` arrives on, if subscribed (for `poll` through
    /// [`Space::pollable_fd`]).
    pub fn port(&self, class: Class) -> Option<Name> {
        self.subs.iter().find(|s| s.class == class).map(|s| s.port)
    }

    /// The server's counters.
    pub fn server_stats(&self) -> Result<InputStats, RequestError> {
        self.stubs.stats()
    }

    /// The device the server reads, in words.
    pub fn device(&self) -> Result<String, RequestError> {
        self.stubs.device()
    }

    /// Unsubscribe cleanly, then close (dropping a handle also works: the server sees
    /// its ports die).
    pub fn close(self) -> Result<(), RequestError> {
        let mut result = Ok(());
        for s in &self.subs {
            if !s.dead.load(Ordering::SeqCst) {
                if let Err(e) = self.stubs.unsubscribe(s.id) {
                    result = Err(e);
                }
            }
        }
        result
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        for s in &self.subs {
            let _ = self.space.request_notification(s.port, NotifyKind::NoSenders, None);
            let _ = self.space.mod_refs(s.port, RightKind::Receive, -1);
        }
        let _ = self.space.deallocate(self.stubs.port());
    }
}
