//! The MARS interfaces, declared once with `#[ictus_idl::interface]`.
//!
//! **Streams** (ids 7000–7006) is the paper's streams API (001 §4.6), on the port the
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

/// One stream's state as [`Streams::state`] carries it ([`STATE_WORDS`] words).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamState {
    /// The stream's id (0 if unknown).
    pub id: u64,
    /// [`STREAM_UNKNOWN`], [`STREAM_OPEN`], [`STREAM_DONE`] (all sent) or
    /// [`STREAM_FAILED`].
    pub state: u32,
    /// Bytes read from storage.
    pub read: u64,
    /// Bytes sent.
    pub sent: u64,
    /// Buffers held: reading, full, sending.
    pub buffers: [u32; 3],
    /// Paced slots sent.
    pub slots: u64,
    /// Late slots.
    pub late: u64,
    /// Worst lateness, ns.
    pub max_late_ns: u64,
}

/// [`StreamState::state`]: no such stream (closed, or never opened).
pub const STREAM_UNKNOWN: u32 = 0;
/// [`StreamState::state`]: open.
pub const STREAM_OPEN: u32 = 1;
/// [`StreamState::state`]: every byte sent.
pub const STREAM_DONE: u32 = 2;
/// [`StreamState::state`]: failed (the destination closed, storage failed).
pub const STREAM_FAILED: u32 = 3;

impl StreamState {
    /// The words [`Streams::state`] sends.
    pub fn to_words(&self) -> [u64; STATE_WORDS] {
        [
            self.id,
            u64::from(self.state),
            self.read,
            self.sent,
            u64::from(self.buffers[0]),
            u64::from(self.buffers[1]),
            u64::from(self.buffers[2]),
            self.slots,
            self.late,
            self.max_late_ns,
        ]
    }

    /// The states in a reply of [`Streams::state`]: `None` unless it holds exactly
    /// [`STATE_WORDS`] words per stream, each in range.
    pub fn from_words(words: &[u64]) -> Option<Vec<StreamState>> {
        if words.len() % STATE_WORDS != 0 {
            return None;
        }
        words
            .chunks_exact(STATE_WORDS)
            .map(|w| {
                let small = |v: u64| u32::try_from(v).ok();
                let state = small(w[1]).filter(|s| *s <= STREAM_FAILED)?;
                Some(StreamState {
                    id: w[0],
                    state,
                    read: w[2],
                    sent: w[3],
                    buffers: [small(w[4])?, small(w[5])?, small(w[6])?],
                    slots: w[7],
                    late: w[8],
                    max_late_ns: w[9],
                })
            })
            .collect()
    }
}

/// The server's counters as [`Streams::stats`] carries them ([`STATS_WORDS`] words,
/// in the order of [`Stats::NAMES`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    /// Connections open now.
    pub connections: u64,
    /// Connections accepted in all.
    pub accepted: u64,
    /// Connections closed at once for being over the limit.
    pub refused: u64,
    /// Connections closed by a timeout.
    pub timed_out: u64,
    /// Requests answered.
    pub requests: u64,
    /// Buffers free, of the pool.
    pub buffers_free: u64,
    /// Buffers in the pool.
    pub buffers: u64,
    /// Bytes sent with zero-copy sends.
    pub bytes_zero_copy: u64,
    /// Bytes sent with copying sends (or `sendfile`).
    pub bytes_copied: u64,
    /// Device reads done.
    pub reads: u64,
    /// Whether reads are `O_DIRECT`.
    pub direct: bool,
    /// Whether buffers are registered with the ring.
    pub registered: bool,
    /// Whether zero-copy send is in use.
    pub zero_copy: bool,
    /// Real-time streams admitted.
    pub rt_streams: u64,
    /// Bytes/s reserved.
    pub reserved: u64,
    /// Bytes/s that may be reserved.
    pub reservable: u64,
}

impl Stats {
    /// The words' names, in order, as `ictus mars stats` prints them.
    pub const NAMES: [&'static str; STATS_WORDS] = [
        "connections",
        "accepted",
        "refused",
        "timed_out",
        "requests",
        "buffers_free",
        "buffers",
        "bytes_zero_copy",
        "bytes_copied",
        "device_reads",
        "o_direct",
        "registered_buffers",
        "zero_copy_send",
        "rt_streams",
        "reserved_bytes_per_s",
        "reservable_bytes_per_s",
    ];

    /// The words [`Streams::stats`] sends.
    pub fn to_words(&self) -> [u64; STATS_WORDS] {
        [
            self.connections,
            self.accepted,
            self.refused,
            self.timed_out,
            self.requests,
            self.buffers_free,
            self.buffers,
            self.bytes_zero_copy,
            self.bytes_copied,
            self.reads,
            u64::from(self.direct),
            u64::from(self.registered),
            u64::from(self.zero_copy),
            self.rt_streams,
            self.reserved,
            self.reservable,
        ]
    }

    /// The counters in a reply of [`Streams::stats`]: `None` unless it holds exactly
    /// [`STATS_WORDS`] words with the flags 0 or 1.
    pub fn from_words(w: &[u64]) -> Option<Stats> {
        let w: &[u64; STATS_WORDS] = w.try_into().ok()?;
        let flag = |v: u64| match v {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        };
        Some(Stats {
            connections: w[0],
            accepted: w[1],
            refused: w[2],
            timed_out: w[3],
            requests: w[4],
            buffers_free: w[5],
            buffers: w[6],
            bytes_zero_copy: w[7],
            bytes_copied: w[8],
            reads: w[9],
            direct: flag(w[10])?,
            registered: flag(w[11])?,
            zero_copy: flag(w[12])?,
            rt_streams: w[13],
            reserved: w[14],
            reservable: w[15],
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_stats_round_trip_and_bad_words_are_refused() {
        let st = StreamState {
            id: 7,
            state: STREAM_DONE,
            read: 1,
            sent: 2,
            buffers: [3, 4, 5],
            slots: 6,
            late: 1,
            max_late_ns: 9,
        };
        let mut words = st.to_words().to_vec();
        words.extend(StreamState::default().to_words());
        assert_eq!(StreamState::from_words(&words), Some(vec![st, StreamState::default()]));
        assert_eq!(StreamState::from_words(&words[1..]), None, "not whole states");
        words[1] = 4;
        assert_eq!(StreamState::from_words(&words), None, "no such state");
        let stats = Stats { connections: 3, direct: true, zero_copy: true, reservable: 80, ..Stats::default() };
        let mut w = stats.to_words();
        assert_eq!(Stats::from_words(&w), Some(stats));
        assert_eq!(Stats::from_words(&w[..15]), None);
        w[10] = 2;
        assert_eq!(Stats::from_words(&w), None, "a flag is 0 or 1");
    }
}
