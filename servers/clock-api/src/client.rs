//! The client side: find the clock (through the name server) or its control port
//! (through the control socket), then call it through the generated stubs.

use std::path::Path;
use std::time::Duration;

use ictus_abi::ReturnCode;
use ictus_idl::{EncodeError, SendOnceRight, SendRight};
use ictus_ipc::{CallError, Name, RightKind, Space};
use ictus_rt::{clock, AlarmId, Time, When};

use crate::control::{self, ControlError};
use crate::protocol::{
    AlarmPort, ClockClient, ClockControlClient, ClockError, ClockStats, WireTime, WireWhen, SERVICE_NAME,
};

/// How long a call waits for the server by default (for a sleep: beyond its deadline):
/// generous, so that only a wedged server turns into an error. A server that dies is
/// seen at once, whatever the timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the clock server could not be found.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The name server could not be reached.
    #[error("cannot find the clock: {0}")]
    NameServer(#[from] ictus_name_api::ConnectError),
    /// The name server has no clock registered (or refused the look-up).
    #[error("{}", lookup_message(.0))]
    Lookup(#[from] ictus_name_api::ClientError),
    /// The control port could not be obtained.
    #[error(transparent)]
    Control(#[from] ControlError),
}

fn lookup_message(e: &ictus_name_api::ClientError) -> String {
    match e {
        ictus_name_api::ClientError::NotFound(name) => {
            format!("no clock is registered with the name server as {name:?}; start one with `ictus clock-server`")
        }
        e => format!("cannot look up the clock ({SERVICE_NAME:?}) with the name server: {e}"),
    }
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The clock refused the request.
    #[error("the clock server refused: {0}")]
    Clock(#[from] ClockError),
    /// The request never reached a method: `MIG_BAD_ID` (for example a control request
    /// sent to the clock port, which does not serve it) or `MIG_BAD_ARGUMENTS`.
    #[error("the clock server refused the request: {0}")]
    Refused(ReturnCode),
    /// The server died, or dropped the request without answering.
    #[error("the clock server died or dropped the request; start it again with `ictus clock-server`")]
    ServerDied,
    /// No answer within the timeout.
    #[error("the clock server did not answer in time")]
    TimedOut,
    /// The right to send alarms to is not a send or receive right in our space.
    #[error("{0} is not a send or receive right in this space")]
    NotARight(Name),
    /// The reply did not decode.
    #[error("the clock server's reply is malformed: {0}")]
    BadReply(ictus_idl::DecodeError),
    /// A time in a reply is not valid.
    #[error("the clock server's reply carries an invalid time")]
    BadTime,
    /// Sending or receiving failed for another reason.
    #[error("calling the clock server: {0}")]
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

impl From<ictus_idl::ClientError<ClockError>> for ClientError {
    fn from(e: ictus_idl::ClientError<ClockError>) -> ClientError {
        use ictus_idl::ClientError as Stub;
        match e {
            Stub::Remote(e) => ClientError::Clock(e),
            Stub::Refused(code) => ClientError::Refused(code),
            Stub::Call(e) => e.into(),
            Stub::Send(e) => CallError::Send(e).into(),
            Stub::Encode(EncodeError::Disposition(right, _)) => ClientError::NotARight(right),
            Stub::Encode(EncodeError::TooLong(_)) => ClientError::Call(CallError::ServerDied),
            Stub::BadReply(e) => ClientError::BadReply(e),
        }
    }
}

fn time_of(w: WireTime) -> Result<Time, ClientError> {
    w.to_time().map_err(|_| ClientError::BadTime)
}

/// How to send `right` as an alarm's destination: copied if it is a send right, made
/// if a receive right.
fn send_right(space: &Space, right: Name) -> Result<SendRight, ClientError> {
    let kinds = space.right_kinds(right).map_err(|_| ClientError::NotARight(right))?;
    if kinds.contains(&RightKind::Send) {
        Ok(SendRight::copy(right))
    } else if kinds.contains(&RightKind::Receive) {
        Ok(SendRight::make(right))
    } else {
        Err(ClientError::NotARight(right))
    }
}

/// A connection to the clock port: the generated [`ClockClient`] stubs on a send right.
///
/// Dropping it releases the right.
#[derive(Debug)]
pub struct Client {
    space: Space,
    stubs: ClockClient,
    timeout: Duration,
}

impl Client {
    /// Find the clock through the name server ([`ictus_name_api::Client::connect`]:
    /// the bootstrap right, else the default socket).
    pub fn connect(space: &Space) -> Result<Client, ConnectError> {
        let ns = ictus_name_api::Client::connect(space)?;
        Client::lookup(space, &ns)
    }

    /// Find the clock through the name server at the socket `path`.
    pub fn connect_socket(space: &Space, name_server: &Path) -> Result<Client, ConnectError> {
        let ns = ictus_name_api::Client::connect_socket(space, name_server)?;
        Client::lookup(space, &ns)
    }

    /// Look the clock up with a name server client (of the same space).
    pub fn lookup(space: &Space, ns: &ictus_name_api::Client) -> Result<Client, ConnectError> {
        let right = ns.lookup(SERVICE_NAME)?;
        Ok(Client::from_right(space, right))
    }

    /// Use a send right to the clock (or control) port that this space holds; the client
    /// takes over one user reference of it.
    pub fn from_right(space: &Space, port: Name) -> Client {
        Client {
            space: space.clone(),
            stubs: ClockClient::new(space, port).with_timeout(DEFAULT_TIMEOUT),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Wait at most `timeout` for each call (for a sleep: beyond its deadline).
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.stubs = self.stubs.with_timeout(timeout);
        self.timeout = timeout;
        self
    }

    /// The send right to the clock, in this client's space.
    pub fn port(&self) -> Name {
        self.stubs.port()
    }

    /// The typed stubs, for calls without this type's conversions.
    pub fn stubs(&self) -> &ClockClient {
        &self.stubs
    }

    /// The time since boot and the wall time, as the server read them.
    pub fn read(&self) -> Result<(Time, Time), ClientError> {
        let (boot, wall) = self.stubs.read()?;
        Ok((time_of(boot)?, time_of(wall)?))
    }

    /// Sleep until `when`; returns the time (since boot) at which the server answered.
    pub fn sleep(&self, when: When) -> Result<Time, ClientError> {
        let wait = when.resolve(clock::now()).saturating_duration_since(clock::now());
        let stubs = self.stubs.with_timeout(wait.saturating_add(self.timeout));
        let woke = stubs.sleep(WireWhen::from_when(when))?;
        time_of(woke)
    }

    /// Sleep until `deadline` (since boot).
    pub fn sleep_until(&self, deadline: Time) -> Result<Time, ClientError> {
        self.sleep(When::At(deadline))
    }

    /// Sleep for `d`, counted from the server's receipt of the request.
    pub fn sleep_for(&self, d: Duration) -> Result<Time, ClientError> {
        self.sleep(When::After(d))
    }

    /// Ask for an [`crate::AlarmMessage`] carrying `tag` at `when`, sent to `port` (a
    /// send right, copied, or a receive right, from which a send right is made). Returns
    /// the alarm's id and its absolute requested time.
    pub fn set_alarm(&self, when: When, port: Name, tag: u64) -> Result<(AlarmId, Time), ClientError> {
        let right = AlarmPort::Send(send_right(&self.space, port)?);
        self.set_alarm_with(when, right, tag)
    }

    /// The same with a send-once right made from the receive right `port`: the alarm
    /// uses it up.
    pub fn set_alarm_once(&self, when: When, port: Name, tag: u64) -> Result<(AlarmId, Time), ClientError> {
        self.set_alarm_with(when, AlarmPort::SendOnce(SendOnceRight::make(port)), tag)
    }

    /// Ask for an alarm with the right given exactly as it should travel.
    pub fn set_alarm_with(&self, when: When, port: AlarmPort, tag: u64) -> Result<(AlarmId, Time), ClientError> {
        let (id, at) = self.stubs.set_alarm(WireWhen::from_when(when), port, tag)?;
        Ok((AlarmId::from_raw(id), time_of(at)?))
    }

    /// Cancel a pending alarm this task set.
    pub fn cancel_alarm(&self, alarm: AlarmId) -> Result<(), ClientError> {
        Ok(self.stubs.cancel_alarm(alarm.as_raw())?)
    }

    /// The alarm resolution (zero: exact).
    pub fn resolution(&self) -> Result<Duration, ClientError> {
        self.stubs.resolution()?.to_duration().map_err(|_| ClientError::BadTime)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.space.deallocate(self.stubs.port());
    }
}

/// A connection to the clock-control port: [`ClockControlClient`] stubs, and a
/// [`Client`] for the clock's ordinary calls on the same port.
#[derive(Debug)]
pub struct Control {
    control: ClockControlClient,
    clock: Client,
}

impl Control {
    /// Get the control port from the default control socket.
    pub fn connect(space: &Space) -> Result<Control, ConnectError> {
        Control::connect_socket(space, &control::default_control_socket_path())
    }

    /// Get the control port from the control socket at `path`.
    pub fn connect_socket(space: &Space, path: &Path) -> Result<Control, ConnectError> {
        let right = control::fetch_control_port(space, path, DEFAULT_TIMEOUT)?;
        Ok(Control::from_right(space, right))
    }

    /// Use a send right to the control port that this space holds; takes over one user
    /// reference of it.
    pub fn from_right(space: &Space, port: Name) -> Control {
        Control {
            control: ClockControlClient::new(space, port).with_timeout(DEFAULT_TIMEOUT),
            clock: Client::from_right(space, port),
        }
    }

    /// Wait at most `timeout` for each call.
    pub fn with_timeout(mut self, timeout: Duration) -> Control {
        self.control = self.control.with_timeout(timeout);
        self.clock = self.clock.with_timeout(timeout);
        self
    }

    /// The clock's ordinary calls, through the control port.
    pub fn clock(&self) -> &Client {
        &self.clock
    }

    /// The typed control stubs.
    pub fn stubs(&self) -> &ClockControlClient {
        &self.control
    }

    /// Set the alarm resolution (zero: exact); returns the previous one.
    pub fn set_resolution(&self, resolution: Duration) -> Result<Duration, ClientError> {
        let prev = self.control.set_resolution(WireTime::from_duration(resolution))?;
        prev.to_duration().map_err(|_| ClientError::BadTime)
    }

    /// The server's counters.
    pub fn stats(&self) -> Result<ClockStats, ClientError> {
        Ok(self.control.stats()?)
    }

    /// Set the per-client quota; returns the previous one.
    pub fn set_client_quota(&self, quota: u32) -> Result<u32, ClientError> {
        Ok(self.control.set_client_quota(quota)?)
    }
}
