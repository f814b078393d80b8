//! The Unix server's control interface, [`UnixControl`].
//!
//! # Requests (`#[ictus_idl::interface(id = 4900)]`)
//!
//! | id | method | in-line data | answer |
//! | --- | --- | --- | --- |
//! | 4900 | [`UnixControl::stats`] | — | [`ServerStats`] |
//! | 4901 | [`UnixControl::programs`] | — | [`Programs`] |
//! | 4902 | [`UnixControl::policy`] | — | the policy's number (`u64`) and text |
//! | 4903 | [`UnixControl::set_policy`] | the new policy's text (at most [`MAX_POLICY`] bytes) | [`PolicyChange`] |
//!
//! Replies follow `ictus_idl`'s conventions (id + 100, a `u32` return code). Every
//! list is a `u32` count, then its items; strings are a `u32` length and UTF-8 bytes.
//! A decoder checks each count against the bytes left before allocating.
//!
//! # Who may do what
//!
//! The port is registered with the name server, which hands it to the tasks of the
//! server's user; a holder may pass it on, as any right. Reading (`stats`, `programs`,
//! `policy`) is for any holder. [`UnixControl::set_policy`] is for the server's user
//! and root only, by the uid in the request's kernel-stamped credentials
//! (`SCM_CREDENTIALS`, the message trailer): anyone else gets [`UnixError::NotAllowed`].
//!
//! # What a policy change does
//!
//! Programs started after it get the new policy — their view, their seccomp filter and
//! their Landlock rules are built from it. Programs already running keep the policy
//! they started with, entirely: a seccomp filter can only be tightened, never loosened,
//! so a running program could not be given a looser one, and tightening only the
//! server's half (paths) while the filter keeps the old network and refusal rules would
//! leave a program under half of each policy.

use ictus_abi::ReturnCode;
use ictus_idl::{Context, Decode, DecodeError, Decoder, Encode, EncodeError, Encoder, RemoteError};

/// The name the server registers with the name server.
pub const SERVICE_NAME: &str = "unix";
/// The longest policy text [`UnixControl::set_policy`] takes, in bytes.
pub const MAX_POLICY: usize = 64 << 10;
/// The control port's message limit: a policy and its framing.
pub const MESSAGE_LIMIT: u32 = MAX_POLICY as u32 + 1024;

/// The Unix server's control interface (see the module documentation).
#[ictus_idl::interface(id = 4900)]
pub trait UnixControl {
    /// The server's counts, all programs together (those that ended included).
    #[id(0)]
    fn stats(&self) -> Result<ServerStats, UnixError>;

    /// The programs served now, each with its counts.
    #[id(1)]
    fn programs(&self) -> Result<Programs, UnixError>;

    /// The policy programs started now get: its number and its text.
    #[id(2)]
    fn policy(&self) -> Result<(u64, String), UnixError>;

    /// Replace the policy for programs started from now on (the server's user and root
    /// only). An invalid policy is refused with the reason and changes nothing.
    #[id(3)]
    fn set_policy(&self, cx: &Context, text: String) -> Result<PolicyChange, UnixError>;
}

/// Why the server refused a request that reached its method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum UnixError {
    /// The sender is neither the server's user nor root (`NoAccess`).
    #[error("only the Unix server's own user and root may change its policy")]
    NotAllowed,
    /// The policy text is longer than [`MAX_POLICY`] (`InvalidArgument`).
    #[error("a policy is at most {MAX_POLICY} bytes")]
    TooLong,
}

impl UnixError {
    /// Every error.
    pub const ALL: [UnixError; 2] = [UnixError::NotAllowed, UnixError::TooLong];

    /// The return code that carries it.
    pub const fn return_code(self) -> ReturnCode {
        match self {
            UnixError::NotAllowed => ReturnCode::NoAccess,
            UnixError::TooLong => ReturnCode::InvalidArgument,
        }
    }
}

impl RemoteError for UnixError {
    fn code(&self) -> u32 {
        self.return_code().code()
    }
    fn from_code(code: u32) -> Option<Self> {
        UnixError::ALL.into_iter().find(|e| e.code() == code)
    }
}

/// What the server counted: the counts `ictus unix run --stats` prints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests served.
    pub served: u64,
    /// Requests refused as malformed.
    pub malformed: u64,
    /// Connections made (one per program thread that asked something).
    pub connections: u64,
    /// Connections open now.
    pub open: u64,
    /// Calls refused, by name (or number), with how often.
    pub refused: Vec<(String, u64)>,
    /// Read-only lookups the programs' libraries made natively, without a request
    /// (only where the program's view hides nothing), as the libraries reported them
    /// on their count page: a program can misreport only its own.
    pub native: NativeLookups,
}

/// Read-only lookups done by the library without the server, by kind (the counts
/// `ictus unix run --stats` prints).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NativeLookups {
    /// `openat` without write, create, truncate or `O_TMPFILE` flags.
    pub opens: u64,
    /// `newfstatat`.
    pub stat: u64,
    /// `statx`.
    pub statx: u64,
    /// `faccessat2` without `W_OK`.
    pub access: u64,
    /// `readlinkat`.
    pub readlink: u64,
    /// `getcwd`.
    pub getcwd: u64,
}

impl NativeLookups {
    /// The kinds in the count page's order (opens, `newfstatat`, `statx`,
    /// `faccessat2`, `readlinkat`, `getcwd`).
    pub const fn from_array(a: [u64; 6]) -> NativeLookups {
        NativeLookups { opens: a[0], stat: a[1], statx: a[2], access: a[3], readlink: a[4], getcwd: a[5] }
    }

    /// The same order back.
    pub const fn to_array(self) -> [u64; 6] {
        [self.opens, self.stat, self.statx, self.access, self.readlink, self.getcwd]
    }

    /// All kinds together.
    pub fn total(&self) -> u64 {
        self.to_array().iter().fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// Add another's counts (saturating: they come from programs' own pages).
    pub fn add(&mut self, other: NativeLookups) {
        let (mut a, b) = (self.to_array(), other.to_array());
        for (x, y) in a.iter_mut().zip(b) {
            *x = x.saturating_add(y);
        }
        *self = NativeLookups::from_array(a);
    }
}

impl Encode for NativeLookups {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        for v in self.to_array() {
            v.encode(enc)?;
        }
        Ok(())
    }
}

impl Decode for NativeLookups {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let mut a = [0u64; 6];
        for v in &mut a {
            *v = u64::decode(dec)?;
        }
        Ok(NativeLookups::from_array(a))
    }
}

impl Counts {
    /// How often `call` was refused.
    pub fn refused_count(&self, call: &str) -> u64 {
        self.refused.iter().find(|(n, _)| n == call).map_or(0, |(_, c)| *c)
    }
}

impl Encode for Counts {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        for v in [self.served, self.malformed, self.connections, self.open] {
            v.encode(enc)?;
        }
        enc.put_len(self.refused.len())?;
        for (name, count) in self.refused {
            name.encode(enc)?;
            count.encode(enc)?;
        }
        self.native.encode(enc)
    }
}

impl Decode for Counts {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let (served, malformed, connections, open) =
            (u64::decode(dec)?, u64::decode(dec)?, u64::decode(dec)?, u64::decode(dec)?);
        // Each item is at least a length (4) and a count (8).
        let n = dec.take_len(12)?;
        let mut refused = Vec::with_capacity(n);
        for _ in 0..n {
            refused.push((String::decode(dec)?, u64::decode(dec)?));
        }
        Ok(Counts { served, malformed, connections, open, refused, native: NativeLookups::decode(dec)? })
    }
}

/// The server's counts ([`UnixControl::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// All programs together, those that ended included.
    pub total: Counts,
    /// Programs whose processes are not all gone.
    pub programs_running: u64,
    /// Programs started since the server started.
    pub programs_started: u64,
    /// The server's worker threads now.
    pub workers: u64,
    /// The current policy's number (1: the one the server started with).
    pub policy: u64,
    /// The server's pid.
    pub pid: u32,
    /// The server's uid (who may change its policy, with root).
    pub uid: u32,
}

impl Encode for ServerStats {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        self.total.encode(enc)?;
        for v in [self.programs_running, self.programs_started, self.workers, self.policy] {
            v.encode(enc)?;
        }
        self.pid.encode(enc)?;
        self.uid.encode(enc)
    }
}

impl Decode for ServerStats {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        Ok(ServerStats {
            total: Counts::decode(dec)?,
            programs_running: u64::decode(dec)?,
            programs_started: u64::decode(dec)?,
            workers: u64::decode(dec)?,
            policy: u64::decode(dec)?,
            pid: u32::decode(dec)?,
            uid: u32::decode(dec)?,
        })
    }
}

/// A program the server serves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Program {
    /// Its number in this server (from 1, in the order started).
    pub id: u64,
    /// The pid of its first process (0 until the client that started it says).
    pub pid: u32,
    /// The number of the policy it runs under.
    pub policy: u64,
    /// Its arguments, as given (not UTF-8: replaced lossily).
    pub argv: Vec<String>,
    /// What the server counted for it.
    pub counts: Counts,
}

impl Encode for Program {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        self.id.encode(enc)?;
        self.pid.encode(enc)?;
        self.policy.encode(enc)?;
        self.argv.encode(enc)?;
        self.counts.encode(enc)
    }
}

impl Decode for Program {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        Ok(Program {
            id: u64::decode(dec)?,
            pid: u32::decode(dec)?,
            policy: u64::decode(dec)?,
            argv: Vec::<String>::decode(dec)?,
            counts: Counts::decode(dec)?,
        })
    }
}

/// The programs served ([`UnixControl::programs`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Programs(pub Vec<Program>);

impl Encode for Programs {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        enc.put_len(self.0.len())?;
        for p in self.0 {
            p.encode(enc)?;
        }
        Ok(())
    }
}

impl Decode for Programs {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        // A program is at least 8 + 4 + 8 + 4 (id, pid, policy, argv's count) and
        // its counts' 4 * 8 + 4 + 6 * 8 bytes.
        let n = dec.take_len(108)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(Program::decode(dec)?);
        }
        Ok(Programs(v))
    }
}

/// What became of a new policy ([`UnixControl::set_policy`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyChange {
    /// Checked and in force for programs started from now on, as this number.
    Installed(u64),
    /// Refused: why (the line and what is wrong, or the bind mount that does not
    /// exist). The policy in force is unchanged.
    Invalid(String),
}

impl Encode for PolicyChange {
    fn encode(self, enc: &mut Encoder) -> Result<(), EncodeError> {
        match self {
            PolicyChange::Installed(n) => {
                0u8.encode(enc)?;
                n.encode(enc)
            }
            PolicyChange::Invalid(why) => {
                1u8.encode(enc)?;
                why.encode(enc)
            }
        }
    }
}

impl Decode for PolicyChange {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        match u8::decode(dec)? {
            0 => Ok(PolicyChange::Installed(u64::decode(dec)?)),
            1 => Ok(PolicyChange::Invalid(String::decode(dec)?)),
            t => Err(DecodeError::BadTag(t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ictus_ipc::{ReceiveOptions, Received, SendOptions, Space};
    use proptest::prelude::*;

    /// `data` as a received message's in-line data: sent to a port of our own.
    fn received(data: Vec<u8>) -> Received {
        let space = Space::new();
        let port = space.allocate_port().unwrap();
        let mut msg = ictus_ipc::Message::new(1, data);
        space.send(port, &mut msg, SendOptions::default()).unwrap();
        let mut r = Received::new();
        space.receive(port, &mut r, ReceiveOptions::default()).unwrap();
        r
    }

    fn round<T: Encode + Decode>(v: T) -> Result<T, DecodeError> {
        let mut enc = Encoder::new(1);
        v.encode(&mut enc).unwrap();
        let mut r = received(enc.into_message().data);
        let mut dec = Decoder::new(&mut r);
        let out = T::decode(&mut dec)?;
        dec.finish()?;
        Ok(out)
    }

    fn counts() -> impl Strategy<Value = Counts> {
        (any::<[u64; 4]>(), proptest::collection::vec(("[a-z0-9_]{0,12}", any::<u64>()), 0..5), any::<[u64; 6]>())
            .prop_map(|(c, refused, native)| Counts {
                served: c[0],
                malformed: c[1],
                connections: c[2],
                open: c[3],
                refused,
                native: NativeLookups::from_array(native),
            })
    }

    proptest! {
        #[test]
        fn counts_and_programs_survive_the_wire(c in counts(), id: u64, pid: u32, policy: u64,
                                                argv in proptest::collection::vec(".{0,8}", 0..4)) {
            let p = Program { id, pid, policy, argv, counts: c.clone() };
            let back = round(Programs(vec![p.clone(), p.clone()])).unwrap().0;
            prop_assert_eq!(back, vec![p.clone(), p]);
            let s = ServerStats { total: c, programs_running: 1, programs_started: 2, workers: 3, policy: 4, pid, uid: 5 };
            prop_assert_eq!(round(s.clone()).unwrap(), s);
        }

        /// Any bytes: a clean error or a value, never a panic or a huge allocation.
        #[test]
        fn hostile_bytes_decode_or_fail_cleanly(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut r = received(data.clone());
            let _ = Programs::decode(&mut Decoder::new(&mut r));
            let mut r = received(data);
            let _ = PolicyChange::decode(&mut Decoder::new(&mut r));
        }
    }

    #[test]
    fn a_policy_change_round_trips_and_a_bad_tag_is_refused() {
        assert_eq!(round(PolicyChange::Installed(7)).unwrap(), PolicyChange::Installed(7));
        let why = PolicyChange::Invalid("policy line 2: no such verb".into());
        assert_eq!(round(why.clone()).unwrap(), why);
        let mut r = received(vec![2]);
        assert_eq!(PolicyChange::decode(&mut Decoder::new(&mut r)), Err(DecodeError::BadTag(2)));
    }

    #[test]
    fn a_huge_count_is_refused_before_allocating() {
        let mut data = vec![0u8; 32];
        data.extend_from_slice(&u32::MAX.to_le_bytes());
        let mut r = received(data);
        assert!(Counts::decode(&mut Decoder::new(&mut r)).is_err());
    }

    #[test]
    fn counts_without_their_native_lookups_are_refused() {
        let c = Counts { served: 1, native: NativeLookups::from_array([1, 2, 3, 4, 5, 6]), ..Counts::default() };
        let mut enc = Encoder::new(1);
        c.clone().encode(&mut enc).unwrap();
        let mut data = enc.into_message().data;
        let mut r = received(data.clone());
        assert_eq!(Counts::decode(&mut Decoder::new(&mut r)).unwrap(), c);
        assert_eq!(c.native.total(), 21);
        data.truncate(data.len() - 8);
        let mut r = received(data);
        assert!(Counts::decode(&mut Decoder::new(&mut r)).is_err(), "a short count page is an error, not zeros");
    }

    #[test]
    fn native_lookups_add_up_without_overflowing() {
        let mut n = NativeLookups::from_array([u64::MAX, 1, 0, 0, 0, 2]);
        n.add(NativeLookups::from_array([1, 1, 1, 1, 1, 1]));
        assert_eq!(n.to_array(), [u64::MAX, 2, 1, 1, 1, 3]);
        assert_eq!(n.total(), u64::MAX);
    }

    #[test]
    fn every_error_has_its_own_code() {
        for e in UnixError::ALL {
            assert_eq!(UnixError::from_code(e.code()), Some(e));
        }
    }
}
