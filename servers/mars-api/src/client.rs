//! The client side: find the streams port (through the name server) or the control
//! port (through the control socket), then call the generated stubs with typed
//! arguments and checked replies.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ictus_abi::ReturnCode;
use ictus_idl::{EncodeError, SendRight};
use ictus_ipc::{CallError, Name, RightKind, RightsError, Space};
use ictus_name_api::socket::{self as ns_socket, FetchError};

use crate::protocol::{
    MarsControlClient, Stats, StreamError, StreamState, StreamsClient, CONTROL_SOCKET_FILE, MAX_BATCH, SERVICE_NAME,
};

/// How long a call waits by default: generous, so that only a wedged server turns into
/// an error. A server that dies is seen at once, whatever the timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The default control socket path for this process's environment and effective uid:
/// [`CONTROL_SOCKET_FILE`] beside the name server's socket.
pub fn default_control_socket_path() -> PathBuf {
    ns_socket::default_socket_path().with_file_name(CONTROL_SOCKET_FILE)
}

/// The default control socket path, its directory made private (`0700`) if missing
/// and checked (for the server, which binds it).
pub fn prepare_default_control_socket_path() -> Result<PathBuf, ns_socket::PathError> {
    Ok(ns_socket::prepare_default_socket_path()?.with_file_name(CONTROL_SOCKET_FILE))
}

/// Why the server could not be found.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The name server could not be reached.
    #[error("cannot find the MARS server: {0}")]
    NameServer(#[from] ictus_name_api::ConnectError),
    /// The name server has no MARS server registered (or refused the look-up).
    #[error("{}", lookup_message(.0))]
    Lookup(#[from] ictus_name_api::ClientError),
    /// Nothing listens on the control socket.
    #[error("no MARS server hands out its control port at {0}: start `ictus mars serve` first")]
    NotRunning(PathBuf),
    /// Another user's socket, or a server that refused us.
    #[error("the MARS control socket {0} refused us: the control port is for the server's user and root")]
    Refused(PathBuf),
    /// Anything else on the control socket.
    #[error("the MARS control socket: {0}")]
    Socket(FetchError),
    /// The right could not be put in our space.
    #[error("taking the control port's send right: {0}")]
    Rights(#[from] RightsError),
}

fn lookup_message(e: &ictus_name_api::ClientError) -> String {
    match e {
        ictus_name_api::ClientError::NotFound(name) => {
            format!("no MARS server is registered with the name server as {name:?}; start one with `ictus mars serve`")
        }
        e => format!("cannot look up the MARS server ({SERVICE_NAME:?}) with the name server: {e}"),
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server refused the call as a whole.
    #[error("the MARS server refused: {0}")]
    Stream(#[from] StreamError),
    /// The request never reached a method (`MIG_BAD_ID`, `MIG_BAD_ARGUMENTS`).
    #[error("the MARS server refused the request: {0}")]
    Refused(ReturnCode),
    /// More streams than one call may carry, or none.
    #[error("a call takes 1 to {MAX_BATCH} streams, not {0}")]
    BadBatch(usize),
    /// The server died, or dropped the request without answering.
    #[error("the MARS server died or dropped the request")]
    ServerDied,
    /// No answer within the timeout.
    #[error("the MARS server did not answer in time")]
    TimedOut,
    /// The owner is not a send or receive right in our space.
    #[error("{0} is not a send or receive right in this space")]
    NotARight(Name),
    /// The reply did not decode, or does not say what the interface promises.
    #[error("the MARS server's reply is malformed")]
    BadReply,
    /// Sending or receiving failed for another reason.
    #[error("calling the MARS server: {0}")]
    Call(CallError),
}

impl From<CallError> for ClientError {
    fn from(e: CallError) -> ClientError {
        match ictus_idl::CallFailure::from(e) {
            ictus_idl::CallFailure::ServerDied => ClientError::ServerDied,
            ictus_idl::CallFailure::TimedOut => ClientError::TimedOut,
            ictus_idl::CallFailure::Other(e) => ClientError::Call(e),
        }
    }
}

impl From<ictus_idl::ClientError<StreamError>> for ClientError {
    fn from(e: ictus_idl::ClientError<StreamError>) -> ClientError {
        use ictus_idl::ClientError as Stub;
        match e {
            Stub::Remote(e) => ClientError::Stream(e),
            Stub::Refused(code) => ClientError::Refused(code),
            Stub::Call(e) => e.into(),
            Stub::Send(e) => CallError::Send(e).into(),
            Stub::Encode(EncodeError::Disposition(right, _)) => ClientError::NotARight(right),
            Stub::Encode(EncodeError::TooLong(_)) => ClientError::BadBatch(MAX_BATCH + 1),
            Stub::BadReply(_) => ClientError::BadReply,
        }
    }
}

/// One stream to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenStream {
    /// The stream's name on the volume.
    pub name: String,
    /// Where to send it: `HOST:PORT`, TCP.
    pub dest: String,
    /// Its first byte.
    pub offset: u64,
    /// Bytes/s, paced by the server (admission-controlled); 0: driven by the client's
    /// calls.
    pub rate: u64,
}

fn batch(ids: &[u64]) -> Result<Vec<u64>, ClientError> {
    if ids.is_empty() || ids.len() > MAX_BATCH {
        return Err(ClientError::BadBatch(ids.len()));
    }
    Ok(ids.to_vec())
}

/// A connection to the streams port: [`StreamsClient`] stubs on a send right.
/// Dropping it releases the right.
#[derive(Debug)]
pub struct Client {
    space: Space,
    stubs: StreamsClient,
}

impl Client {
    /// Find the server through the name server ([`ictus_name_api::Client::connect`]).
    pub fn connect(space: &Space) -> Result<Client, ConnectError> {
        let ns = ictus_name_api::Client::connect(space)?;
        Client::lookup(space, &ns)
    }

    /// Find the server through the name server at the socket `path`.
    pub fn connect_socket(space: &Space, name_server: &Path) -> Result<Client, ConnectError> {
        let ns = ictus_name_api::Client::connect_socket(space, name_server)?;
        Client::lookup(space, &ns)
    }

    /// Look the server up with a name server client (of the same space).
    pub fn lookup(space: &Space, ns: &ictus_name_api::Client) -> Result<Client, ConnectError> {
        Ok(Client::from_right(space, ns.lookup(SERVICE_NAME)?))
    }

    /// Use a send right to the streams (or control) port that this space holds; the
    /// client takes over one user reference of it.
    pub fn from_right(space: &Space, port: Name) -> Client {
        Client { space: space.clone(), stubs: StreamsClient::new(space, port).with_timeout(DEFAULT_TIMEOUT) }
    }

    /// Wait at most `timeout` for each call.
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.stubs = self.stubs.with_timeout(timeout);
        self
    }

    /// The typed stubs, for calls without this type's checks.
    pub fn stubs(&self) -> &StreamsClient {
        &self.stubs
    }

    /// Opens `streams` in one call, each with `chains` buffers of read-ahead. `owner`
    /// is a port of this task (a receive right, from which a send right is made, or a
    /// send right, copied): when it dies the server closes these streams. Per stream,
    /// its id or the server's reason for refusing it.
    pub fn open(
        &self,
        owner: Name,
        streams: &[OpenStream],
        chains: u32,
    ) -> Result<Vec<Result<u64, String>>, ClientError> {
        if streams.is_empty() || streams.len() > MAX_BATCH {
            return Err(ClientError::BadBatch(streams.len()));
        }
        let kinds = self.space.right_kinds(owner).map_err(|_| ClientError::NotARight(owner))?;
        let owner_right = if kinds.contains(&RightKind::Send) {
            SendRight::copy(owner)
        } else if kinds.contains(&RightKind::Receive) {
            SendRight::make(owner)
        } else {
            return Err(ClientError::NotARight(owner));
        };
        let (ids, reasons) = self.stubs.open(
            owner_right,
            streams.iter().map(|s| s.name.clone()).collect(),
            streams.iter().map(|s| s.dest.clone()).collect(),
            streams.iter().map(|s| s.offset).collect(),
            streams.iter().map(|s| s.rate).collect(),
            chains,
        )?;
        if ids.len() != streams.len() || reasons.len() != streams.len() {
            return Err(ClientError::BadReply);
        }
        Ok(ids.into_iter().zip(reasons).map(|(id, why)| if id == 0 { Err(why) } else { Ok(id) }).collect())
    }

    /// Fills the streams' buffer chains from storage.
    pub fn read(&self, ids: &[u64]) -> Result<(), ClientError> {
        Ok(self.stubs.read(batch(ids)?)?)
    }

    /// Sends what the streams have read.
    pub fn send(&self, ids: &[u64]) -> Result<(), ClientError> {
        Ok(self.stubs.send(batch(ids)?)?)
    }

    /// Reads one chunk per stream and sends it once read.
    pub fn read_send(&self, ids: &[u64]) -> Result<(), ClientError> {
        Ok(self.stubs.read_send(batch(ids)?)?)
    }

    /// The streams' states, in the order asked.
    pub fn state(&self, ids: &[u64]) -> Result<Vec<StreamState>, ClientError> {
        let words = self.stubs.state(batch(ids)?)?;
        let states = StreamState::from_words(&words).ok_or(ClientError::BadReply)?;
        if states.len() != ids.len() {
            return Err(ClientError::BadReply);
        }
        Ok(states)
    }

    /// Closes the streams; their buffers are freed once the kernel is done with them.
    pub fn close(&self, ids: &[u64]) -> Result<(), ClientError> {
        Ok(self.stubs.close(batch(ids)?)?)
    }

    /// The server's counters.
    pub fn stats(&self) -> Result<Stats, ClientError> {
        Stats::from_words(&self.stubs.stats()?).ok_or(ClientError::BadReply)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.space.deallocate(self.stubs.port());
    }
}

/// A connection to the control port: [`MarsControlClient`] stubs, and a [`Client`]
/// for the streams calls on the same port.
#[derive(Debug)]
pub struct Control {
    control: MarsControlClient,
    streams: Client,
}

/// One Deficit Round Robin class, as [`Control::classes`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Class {
    /// `rt`, `nrt`, or a weighted class's name.
    pub name: String,
    /// Sectors (512 bytes) per round.
    pub quantum: u32,
    /// Sectors served so far, on every device.
    pub served: u64,
}

impl Control {
    /// Get the control port from the default control socket.
    pub fn connect(space: &Space) -> Result<Control, ConnectError> {
        Control::connect_socket(space, &default_control_socket_path())
    }

    /// Get the control port from the control socket at `path`.
    pub fn connect_socket(space: &Space, path: &Path) -> Result<Control, ConnectError> {
        let fd = ns_socket::fetch_service_fd(path, DEFAULT_TIMEOUT).map_err(|e| match e {
            FetchError::NotRunning(p) => ConnectError::NotRunning(p),
            FetchError::Untrusted { path, .. } | FetchError::BadHandshake { path, .. } => ConnectError::Refused(path),
            e => ConnectError::Socket(e),
        })?;
        Ok(Control::from_right(space, space.insert_send_fd(fd)?))
    }

    /// Use a send right to the control port that this space holds; takes over one user
    /// reference of it.
    pub fn from_right(space: &Space, port: Name) -> Control {
        // The streams client shares the right: it takes a reference of its own.
        let _ = space.mod_refs(port, RightKind::Send, 1);
        Control {
            control: MarsControlClient::new(space, port).with_timeout(DEFAULT_TIMEOUT),
            streams: Client::from_right(space, port),
        }
    }

    /// The streams calls, through the control port.
    pub fn streams(&self) -> &Client {
        &self.streams
    }

    /// Sets `class`'s quantum to `sectors` on every device from the next round; a new
    /// name adds a weighted class.
    pub fn set_quantum(&self, class: &str, sectors: u32) -> Result<(), ClientError> {
        Ok(self.control.set_quantum(class, sectors)?)
    }

    /// The classes, their quanta and what each was served.
    pub fn classes(&self) -> Result<Vec<Class>, ClientError> {
        let (names, quanta, served) = self.control.classes()?;
        if names.len() != quanta.len() || names.len() != served.len() {
            return Err(ClientError::BadReply);
        }
        Ok(names
            .into_iter()
            .zip(quanta)
            .zip(served)
            .map(|((name, quantum), served)| Class { name, quantum, served })
            .collect())
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = self.streams.space.deallocate(self.control.port());
    }
}
