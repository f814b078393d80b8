//! The MARS interfaces, declared once with `#[ictus_idl::interface]`.
//!
//! **Streams** (ids 7000–7007) is the paper's streams API (001 §4.6), on the port the
//! server registers with the name server as [`SERVICE_NAME`]. Every call takes many
//! streams at once — "aggregation of multiple read/send requests for same or different
//! active streams into a single system call" — so one message and one engine wake-up
//! serve them all.
//!
//! | id | method | what |
//! | --- | --- | --- |
//! | 7000 | [`Streams::open`] | `streamopen`: per stream a name, a destination `HOST:PORT` (TCP), a first byte and a rate; returns ids, or for each refused stream 0 and the reason |
//! | 7001 | [`Streams::read`] | `stream_read`: fill the streams' buffer chains from storage |
//! | 7002 | [`Streams::send`] | `stream_send`: send what has been read |
//! | 7003 | [`Streams::read_send`] | `stream_rdsnd`: read one chunk and send it once read |
//! | 7004 | [`Streams::state`] | `stream_state`: [`STATE_WORDS`] `u64`s per stream |
//! | 7005 | [`Streams::close`] | `stream_close`: stop; buffers are freed once the kernel is done |
//! | 7006 | [`Streams::stats`] | the server's counters ([`STATS_WORDS`] `u64`s) |
//!
//! A stream opened with a rate is **paced by the server**: admission control checks
//! the rate against the volume's measured capability, and a Real-Time Upcall sends one
//! chunk per period. A stream opened with rate 0 is driven by its client's calls, as in
//! the paper's experiments.
//!
//! `open` takes an **owner** send right: when that port dies (its task exits, even by
//! `kill -9`), the server closes the owner's streams and frees their buffers.
//!
//! **MarsControl** (ids 7100–7101) is on the control port, handed only to the server's
//! user and root through the control socket: change a Deficit Round Robin class's
//! quantum (adding the class if it is new), list the classes.

// The interfaces mirror the paper's calls: `open` takes the streams' parallel lists in
// one message, and `classes` answers three parallel lists.
#![allow(clippy::too_many_arguments, clippy::type_complexity)]

use ictus_abi::ReturnCode;
use ictus_idl::{Context, RemoteError, SendRight};

/// The name the streams port is registered under.
pub const SERVICE_NAME: &str = "mars";
/// The control socket's file name, beside the name server's socket.
pub const CONTROL_SOCKET_FILE: &str = "mars-control.sock";
/// Words per stream in [`Streams::state`]: id, state (0 unknown, 1 open, 2 done, 3
/// failed), bytes read, bytes sent, buffers reading, full, sending, slots sent, late
/// slots, worst lateness (ns).
pub const STATE_WORDS: usize = 10;
/// Words in [`Streams::stats`]: connections, accepted, refused, timed out, requests,
/// buffers free, buffers, bytes sent zero-copy, bytes sent copying, device reads,
/// O_DIRECT (0/1), registered buffers (0/1), zero-copy send (0/1), real-time streams,
/// bytes/s reserved, bytes/s reservable.
pub const STATS_WORDS: usize = 16;
/// Most streams in one call.
pub const MAX_BATCH: usize = 1024;

/// Why a streams call failed as a whole (per-stream refusals of `open` travel in its
/// result).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The lists differ in length, are empty or longer than [`MAX_BATCH`].
    #[error("bad batch: lists of different lengths, empty, or over 1024 streams")]
    BadBatch,
    /// The engine has stopped.
    #[error("the stream engine has stopped")]
    Stopped,
    /// A value is out of range (a class name, a quantum).
    #[error("invalid argument")]
    Invalid,
}

impl StreamError {
    const ALL: [StreamError; 3] = [StreamError::BadBatch, StreamError::Stopped, StreamError::Invalid];
    fn return_code(self) -> ReturnCode {
        match self {
            StreamError::BadBatch => ReturnCode::InvalidArgument,
            StreamError::Stopped => ReturnCode::Failure,
            StreamError::Invalid => ReturnCode::InvalidValue,
        }
    }
}

impl RemoteError for StreamError {
    fn code(&self) -> u32 {
        self.return_code().code()
    }
    fn from_code(code: u32) -> Option<Self> {
        StreamError::ALL.into_iter().find(|e| e.code() == code)
    }
}

/// The streams API.
#[ictus_idl::interface(id = 7000)]
pub trait Streams {
    /// Opens streams: `names[i]` from byte `offsets[i]`, sent to `dests[i]`
    /// (`HOST:PORT`, TCP), paced at `rates[i]` bytes/s (0: by the client's calls), with
    /// `chains` buffers of read-ahead each. Returns per stream its id (0 if refused)
    /// and the reason ("" if opened).
    #[id(0)]
    fn open(
        &self,
        cx: &Context,
        owner: SendRight,
        names: Vec<String>,
        dests: Vec<String>,
        offsets: Vec<u64>,
        rates: Vec<u64>,
        chains: u32,
    ) -> Result<(Vec<u64>, Vec<String>), StreamError>;

    /// Fills the streams' chains.
    #[id(1)]
    fn read(&self, ids: Vec<u64>) -> Result<(), StreamError>;

    /// Sends what the streams have read.
    #[id(2)]
    fn send(&self, ids: Vec<u64>) -> Result<(), StreamError>;

    /// Reads one chunk per stream and sends it once read.
    #[id(3)]
    fn read_send(&self, ids: Vec<u64>) -> Result<(), StreamError>;

    /// [`STATE_WORDS`] words per stream.
    #[id(4)]
    fn state(&self, ids: Vec<u64>) -> Result<Vec<u64>, StreamError>;

    /// Closes the streams.
    #[id(5)]
    fn close(&self, ids: Vec<u64>) -> Result<(), StreamError>;

    /// The server's counters, [`STATS_WORDS`] words.
    #[id(6)]
    fn stats(&self) -> Result<Vec<u64>, StreamError>;
}

/// The control interface.
#[ictus_idl::interface(id = 7100)]
pub trait MarsControl {
    /// Sets `class`'s quantum to `sectors` (512 bytes each) on every device, from the
    /// next round; a new class name adds a weighted class.
    #[id(0)]
    fn set_quantum(&self, class: String, sectors: u32) -> Result<(), StreamError>;

    /// The classes: names, quanta and sectors served so far.
    #[id(1)]
    fn classes(&self) -> Result<(Vec<String>, Vec<u32>, Vec<u64>), StreamError>;
}
