//! What the library and the server say to each other, and the numbers both must agree
//! on (reserved descriptors, the library's address range, the filter's probe).
//!
//! A request is one `SOCK_SEQPACKET` datagram: a [`RequestHeader`], then up to two
//! paths and some extra bytes, sent with `sendto` and no address; the kernel adds the
//! caller's pid, uid and gid (`SCM_CREDENTIALS`) and a pidfd of it (`SCM_PIDFD`). The
//! program's descriptors the call names travel as numbers in the header's arguments
//! ([`RequestHeader::fd_args`] says which): the server takes them from the sender with
//! `pidfd_getfd`, so the library never needs `sendmsg` (which the filter can then
//! trap from everywhere: its address is the one thing the filter cannot read). A
//! reply is a [`ReplyHeader`], its data, and the descriptors the server hands over
//! (`SCM_RIGHTS`, received with `recvmsg`).
//!
//! The server decodes requests with [`Request::parse`] (a checked view: nothing is
//! read before its length is checked); the fuzz target `unix_request` drives it.
//!
//! Pure: no system calls.

/// `"IUX1"`, first word of every request and reply.
pub const MAGIC: u32 = 0x3158_5549;
/// The hello that gives the server a new connection, sent on [`SESSION_FD`] followed
/// by the connection's descriptor number in the sender ([`encode_hello`]).
pub const HELLO: [u8; 8] = *b"IUXHELLO";
/// Length of a hello: [`HELLO`] and a descriptor number.
pub const HELLO_LEN: usize = 12;

/// The hello naming descriptor `fd` of the sender.
pub fn encode_hello(fd: i32) -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..8].copy_from_slice(&HELLO);
    h[8..].copy_from_slice(&fd.to_le_bytes());
    h
}

/// Length of a hello that names the sending thread too ([`encode_hello_from`]).
pub const HELLO_THREAD_LEN: usize = HELLO_LEN + 4;

/// The hello naming descriptor `fd` of the sender, sent by its thread `tid`: the
/// server takes descriptors through that thread (a process whose main thread has
/// exited has none to take them through), once it has checked that the thread is
/// the sender's.
pub fn encode_hello_from(fd: i32, tid: i32) -> [u8; HELLO_THREAD_LEN] {
    let mut h = [0u8; HELLO_THREAD_LEN];
    h[..HELLO_LEN].copy_from_slice(&encode_hello(fd));
    h[HELLO_LEN..].copy_from_slice(&tid.to_le_bytes());
    h
}

/// The descriptor number a hello names, if `bytes` is one (a non-negative number).
pub fn parse_hello(bytes: &[u8]) -> Option<i32> {
    if !(bytes.len() == HELLO_LEN || bytes.len() == HELLO_THREAD_LEN) || bytes[..8] != HELLO {
        return None;
    }
    let fd = le32(bytes, 8) as i32;
    (fd >= 0).then_some(fd)
}

/// The sending thread a hello names, if it is a hello that names one (a positive
/// number).
pub fn hello_thread(bytes: &[u8]) -> Option<i32> {
    parse_hello(bytes)?;
    let tid = (bytes.len() == HELLO_THREAD_LEN).then(|| le32(bytes, HELLO_LEN) as i32)?;
    (tid > 0).then_some(tid)
}

/// The session socket every process of a session inherits: hellos go there.
pub const SESSION_FD: i32 = 1023;
/// The namespace generation page (read-only to every process).
pub const GEN_FD: i32 = 1022;
/// The program the loader maps (set up by whoever execs the loader).
pub const PROG_FD: i32 = 1021;
/// Its interpreter (`PT_INTERP`), or closed.
pub const INTERP_FD: i32 = 1020;
/// The seccomp filter for the first loader of a session, or closed.
pub const FILTER_FD: i32 = 1019;
/// The session's count page (written by every library: see [`COUNT_NATIVE_AT`]), or
/// closed: then the library does no lookup natively.
pub const COUNT_FD: i32 = 1018;
/// Lowest descriptor the library reserves; `[RESERVED_LO, 1024)` are its own.
pub const RESERVED_LO: i32 = 960;
/// The connection the server made for a new image, handed over in the exec's reply
/// and left here for the loader, which moves it into its table (see
/// [`EXEC_HANDS_CONNECTION`]), or closed.
pub const HANDED_FD: i32 = 1017;
/// Connections live in `[RESERVED_LO, CONN_HI)`.
pub const CONN_HI: i32 = 1017;

/// The library (the loader image) is linked at a fixed address, the same in every
/// process, so that one seccomp filter installed once can tell its call sites.
pub const LIB_LO: u64 = 0x0500_0000;
/// One past the library's highest address.
pub const LIB_HI: u64 = 0x0510_0000;

/// The library's process-state page ([`crate::state`]): the same address in every
/// process, inside the library's range.
pub const STATE_ADDR: u64 = 0x050e_0000;
/// The jump table of patched call sites: slot `k` at `PATCH_TABLE + 8k`. Its
/// address's two high bytes are `0f 05` — `syscall` — so that a patched site's
/// `jmp qword ptr [PATCH_TABLE + 8k]` ends with the bytes it replaced
/// (see `patch`).
pub const PATCH_TABLE: u64 = 0x050f_0000;
/// Slots of the table: patched sites and trampolines per process.
pub const PATCH_SLOTS: usize = 2048;
const _: () = assert!(PATCH_TABLE >> 16 == 0x050f && (PATCH_TABLE & 0xffff) + 8 * PATCH_SLOTS as u64 <= 0x1_0000);
const _: () = assert!(LIB_LO <= STATE_ADDR && PATCH_TABLE + 8 * PATCH_SLOTS as u64 <= LIB_HI);

/// Where, on the generation page, the policy's refused calls are: one bit per
/// system call number below [`crate::sysno::MAX_KNOWN`], written by the server before
/// any program runs. The library asks the server about a refused call instead of
/// answering it itself, so the refusal is applied and counted.
pub const GEN_REFUSED_AT: usize = 64;
const _: () = assert!(GEN_REFUSED_AT + (crate::sysno::MAX_KNOWN as usize).div_ceil(8) <= 4096);

/// Where, on the generation page, the count of unlinks served is (a `u64`): the
/// libraries' "not a link" answers are kept under it (see [`crate::cache`]).
pub const GEN_UNLINKS_AT: usize = 8;
/// Where, on the generation page, the session's flags are (a `u64` the server writes
/// before any program runs): [`GEN_FLAG_NATIVE_LOOKUPS`].
pub const GEN_FLAGS_AT: usize = 16;
/// The view confines nothing a read-only lookup could reveal (no `hide`, no bind
/// mount, no other root): the library may do read-only lookups natively (the filter
/// allows them from its code, with read-only arguments only).
pub const GEN_FLAG_NATIVE_LOOKUPS: u64 = 1;
/// Besides, nothing in the view is read-only (no `ro` line, no read-only bind): an
/// `faccessat2` with `W_OK` gets the kernel's answer from the server too, so the
/// library may ask the kernel itself (the filter allows it from its code).
pub const GEN_FLAG_NATIVE_WRITE_ACCESS: u64 = 2;
/// `O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | __O_TMPFILE`: an `openat` with none of
/// these only looks, and may be done natively (the filter tests these bits of the
/// flags' lower half, which is all the kernel reads).
pub const NATIVE_OPEN_WRITE_BITS: u64 = 0o3 | 0o100 | 0o1000 | 0o20000000;
/// `W_OK`: a `faccessat2` asking about writes stays served where something is
/// read-only (an `ro` line answers `EROFS`; see [`GEN_FLAG_NATIVE_WRITE_ACCESS`]).
pub const NATIVE_ACCESS_WRITE_BIT: u64 = 2;

/// The count page ([`COUNT_FD`]): one `u64` per kind of lookup the libraries did
/// natively — opens, `newfstatat`, `statx`, `faccessat2`, `readlinkat`, `getcwd` —
/// at `COUNT_NATIVE_AT + 8 * kind`. The libraries add to it; the server reads it for
/// the session's counts. A program can write it too: it can only misreport its own
/// session's numbers.
pub const COUNT_NATIVE_AT: usize = 0;
/// Kinds of native lookups counted.
pub const COUNT_KINDS: usize = 6;
/// Size of the count memfd.
pub const COUNT_SIZE: usize = 4096;

/// The name buckets, after the generation page: [`GEN_BUCKETS`] `u32` counters, one
/// bumped by the server whenever a file is created under a name that hashes there
/// ([`crate::cache::bucket_of`]).
pub const GEN_BUCKETS_AT: usize = 4096;
/// How many name buckets.
pub const GEN_BUCKETS: usize = 1024;
/// The session's shared table of failed lookups, after the buckets:
/// [`GEN_MISSING_SLOTS`] entries of two words, a lookup's key
/// ([`crate::cache::key`] of an absolute path) and what it was kept under
/// ([`crate::cache::generation_for`]). Only the server writes it (the memfd is
/// sealed against every other writer); every library reads it, so a lookup one
/// process found missing costs the others of the session no round trip.
pub const GEN_MISSING_AT: usize = GEN_BUCKETS_AT + 4 * GEN_BUCKETS;
/// Entries of the shared table.
pub const GEN_MISSING_SLOTS: usize = 4096;
/// The shared table is set-associative: a key may sit in any of the
/// [`GEN_MISSING_WAYS`] entries of its set (one 64-byte line). Direct-mapped, two
/// failures every compile asks for shared a slot now and then (~10 of ~370 keys in
/// the Andrew benchmark) and pushed each other out: every compile asked both again.
pub const GEN_MISSING_WAYS: usize = 4;
const _: () = assert!(GEN_MISSING_SLOTS % GEN_MISSING_WAYS == 0 && GEN_MISSING_AT % 64 == 0);
/// Size of the generation memfd: the page, the buckets, the shared table.
pub const GEN_SIZE: usize = GEN_MISSING_AT + 16 * GEN_MISSING_SLOTS;
const _: () = assert!(GEN_UNLINKS_AT + 8 <= GEN_FLAGS_AT && GEN_FLAGS_AT + 8 <= GEN_REFUSED_AT);

/// A system call number no kernel has, for which the session's filter answers
/// [`PROBE_ERRNO`]: how the loader tells whether the filter is already installed.
pub const PROBE_NR: u32 = 0x3fff_0001;
/// The errno the filter answers to [`PROBE_NR`].
pub const PROBE_ERRNO: u16 = 4000;
/// The data the filter puts in a trap (`si_errno` of the SIGSYS): a trap with other
/// data comes from a filter the program installed itself.
pub const TRAP_DATA: u16 = 0x1c7;

/// Longest path carried (the kernel's `PATH_MAX`, without the NUL).
pub const PATH_MAX: usize = 4095;
/// Largest request datagram.
pub const MAX_REQUEST: usize = 64 * 1024;
/// Largest reply datagram.
pub const MAX_REPLY: usize = 64 * 1024;
/// Most descriptors in one message.
pub const MAX_FDS: usize = 3;
/// Most descriptors in one reply: an exec's loader, program, interpreter and the new
/// image's connection.
pub const MAX_REPLY_FDS: usize = 4;
/// In an exec reply's first data byte (the count of argv prefix strings): the last
/// descriptor is a connection made for the new image ([`HANDED_FD`]).
pub const EXEC_HANDS_CONNECTION: u8 = 0x80;
/// Most control data a program's send carries to the server (`SENDMSG`: the
/// kernel's own limit, `optmem_max`, is 20 KiB by default; 253 descriptors —
/// `SCM_MAX_FD` — take 1,028 bytes). More is `ENOBUFS`, as the kernel answers.
pub const MAX_SEND_CONTROL: usize = 4096;

/// Request header. All fields little-endian, as on the machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RequestHeader {
    /// [`MAGIC`].
    pub magic: u32,
    /// The system call number.
    pub op: u32,
    /// Bit `i` set: argument `i` is a descriptor of the sender, which the server takes
    /// with `pidfd_getfd` (at most [`MAX_FDS`] of them).
    pub fd_args: u32,
    /// Length of the first path (no NUL); `u32::MAX` if there is none.
    pub len1: u32,
    /// Length of the second path; `u32::MAX` if there is none.
    pub len2: u32,
    /// Length of the extra bytes.
    pub len3: u32,
    /// The caller's working-directory generation: changes whenever the process changes
    /// directory (the library counts `chdir` and `fchdir`). The server keeps the
    /// directory it opened for a connection's relative paths while this stays the
    /// same. A lie costs only the liar: it walks from a directory it was in before.
    pub cwd: u64,
    /// The call's six arguments as the program passed them (pointers are meaningless
    /// to the server and never used).
    pub args: [u64; 6],
}

/// Size of [`RequestHeader`] on the wire.
pub const REQUEST_HEADER: usize = 80;
const _: () = assert!(core::mem::size_of::<RequestHeader>() == REQUEST_HEADER);

/// Reply header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct ReplyHeader {
    /// [`MAGIC`].
    pub magic: u32,
    /// Descriptors attached.
    pub nfds: u32,
    /// The call's result: a value, or `-errno`.
    pub result: i64,
    /// Bytes of data after the header.
    pub data_len: u32,
    /// Zero.
    pub reserved: u32,
}

/// Size of [`ReplyHeader`] on the wire.
pub const REPLY_HEADER: usize = 24;
const _: () = assert!(core::mem::size_of::<ReplyHeader>() == REPLY_HEADER);

/// Why a request was refused before any work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// Shorter than a header.
    Short,
    /// Not [`MAGIC`].
    Magic,
    /// The lengths do not add up to the datagram's size.
    Length,
    /// A path longer than [`PATH_MAX`] or containing a NUL.
    Path,
    /// More descriptors named than [`MAX_FDS`], or a bit beyond the six arguments.
    Fds,
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            WireError::Short => "shorter than a request header",
            WireError::Magic => "bad magic",
            WireError::Length => "lengths do not add up to the datagram",
            WireError::Path => "path too long or containing NUL",
            WireError::Fds => "more than three descriptors, or not among the six arguments",
        })
    }
}

/// A checked request: every length inside the datagram, paths without NUL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The header, copied out.
    pub header: RequestHeader,
    /// The first path, if any.
    pub path1: Option<&'a [u8]>,
    /// The second path, if any.
    pub path2: Option<&'a [u8]>,
    /// Extra bytes.
    pub extra: &'a [u8],
}

const NONE: u32 = u32::MAX;

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl<'a> Request<'a> {
    /// Check a datagram.
    pub fn parse(bytes: &'a [u8]) -> Result<Request<'a>, WireError> {
        if bytes.len() < REQUEST_HEADER {
            return Err(WireError::Short);
        }
        let mut args = [0u64; 6];
        for (i, a) in args.iter_mut().enumerate() {
            *a = le64(bytes, 32 + 8 * i);
        }
        let header = RequestHeader {
            magic: le32(bytes, 0),
            op: le32(bytes, 4),
            fd_args: le32(bytes, 8),
            len1: le32(bytes, 12),
            len2: le32(bytes, 16),
            len3: le32(bytes, 20),
            cwd: le64(bytes, 24),
            args,
        };
        if header.magic != MAGIC {
            return Err(WireError::Magic);
        }
        if header.fd_args & !0x3f != 0 || header.fd_args.count_ones() as usize > MAX_FDS {
            return Err(WireError::Fds);
        }
        let body = &bytes[REQUEST_HEADER..];
        let mut at = 0usize;
        let mut take = |len: u32, is_path: bool| -> Result<Option<&'a [u8]>, WireError> {
            if is_path && len == NONE {
                return Ok(None);
            }
            let len = len as usize;
            if is_path && len > PATH_MAX {
                return Err(WireError::Path);
            }
            let end = at.checked_add(len).ok_or(WireError::Length)?;
            let s = body.get(at..end).ok_or(WireError::Length)?;
            at = end;
            if is_path && s.contains(&0) {
                return Err(WireError::Path);
            }
            Ok(Some(s))
        };
        let path1 = take(header.len1, true)?;
        let path2 = take(header.len2, true)?;
        let extra = take(header.len3, false)?.unwrap_or(&[]);
        if at != body.len() {
            return Err(WireError::Length);
        }
        Ok(Request { header, path1, path2, extra })
    }
}

/// Whether the encoded request `req` names descriptors of its sender (arguments
/// marked in [`RequestHeader::fd_args`], or a `sendmsg`'s `SCM_RIGHTS`): the server
/// takes those only from the process that made the connection, so such a request
/// cannot go on a connection borrowed from another process.
pub fn names_descriptors(req: &[u8]) -> bool {
    let word = |at: usize| req.get(at..at + 4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
    !matches!((word(4), word(8)), (Some(op), Some(0)) if op != crate::sysno::SENDMSG)
}

/// Write a request into `out`; returns its length, or `None` if it does not fit.
#[allow(clippy::too_many_arguments)]
pub fn encode_request(
    out: &mut [u8],
    op: u32,
    cwd: u64,
    fd_args: u32,
    args: [u64; 6],
    path1: Option<&[u8]>,
    path2: Option<&[u8]>,
    extra: &[u8],
) -> Option<usize> {
    let len = |p: Option<&[u8]>| p.map_or(NONE, |p| p.len() as u32);
    let total = REQUEST_HEADER + path1.map_or(0, |p| p.len()) + path2.map_or(0, |p| p.len()) + extra.len();
    if total > out.len() {
        return None;
    }
    out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&op.to_le_bytes());
    out[8..12].copy_from_slice(&fd_args.to_le_bytes());
    out[12..16].copy_from_slice(&len(path1).to_le_bytes());
    out[16..20].copy_from_slice(&len(path2).to_le_bytes());
    out[20..24].copy_from_slice(&(extra.len() as u32).to_le_bytes());
    out[24..32].copy_from_slice(&cwd.to_le_bytes());
    for (i, a) in args.iter().enumerate() {
        out[32 + 8 * i..40 + 8 * i].copy_from_slice(&a.to_le_bytes());
    }
    let mut at = REQUEST_HEADER;
    for part in [path1.unwrap_or(&[]), path2.unwrap_or(&[]), extra] {
        out[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    Some(at)
}

/// Write a reply header into `out[..REPLY_HEADER]`.
pub fn encode_reply_header(out: &mut [u8], result: i64, nfds: u32, data_len: u32) {
    out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&nfds.to_le_bytes());
    out[8..16].copy_from_slice(&result.to_le_bytes());
    out[16..20].copy_from_slice(&data_len.to_le_bytes());
    out[20..24].copy_from_slice(&0u32.to_le_bytes());
}

/// A checked reply: `(result, data)`, or `None` if malformed.
pub fn parse_reply(bytes: &[u8], nfds: usize) -> Option<(i64, &[u8])> {
    if bytes.len() < REPLY_HEADER || le32(bytes, 0) != MAGIC || le32(bytes, 4) as usize != nfds {
        return None;
    }
    let len = le32(bytes, 16) as usize;
    let data = bytes.get(REPLY_HEADER..)?;
    if data.len() != len {
        return None;
    }
    Some((le64(bytes, 8) as i64, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips() {
        let mut buf = [0u8; 512];
        let n = encode_request(&mut buf, 257, 7, 1, [3, 0, 2, 0o644, 0, 0], Some(b"a/b"), None, b"xy").unwrap();
        let r = Request::parse(&buf[..n]).unwrap();
        assert_eq!(r.header.op, 257);
        assert_eq!(r.path1, Some(&b"a/b"[..]));
        assert_eq!(r.path2, None);
        assert_eq!(r.extra, b"xy");
        assert_eq!(r.header.args[3], 0o644);
        assert_eq!(r.header.cwd, 7);
    }

    #[test]
    fn requests_that_name_descriptors_are_told_apart() {
        let mut buf = [0u8; 512];
        let n = encode_request(&mut buf, crate::sysno::EXECVEAT, 0, 0, [0; 6], Some(b"/bin/true"), None, b"").unwrap();
        assert!(!names_descriptors(&buf[..n]));
        let n =
            encode_request(&mut buf, crate::sysno::EXECVEAT, 0, 1, [3, 0, 0, 0, 0, 0], Some(b"x"), None, b"").unwrap();
        assert!(names_descriptors(&buf[..n]));
        let n = encode_request(&mut buf, crate::sysno::SENDMSG, 0, 0, [0; 6], None, None, b"").unwrap();
        assert!(names_descriptors(&buf[..n]));
        // Too short to tell: as if it did.
        assert!(names_descriptors(&buf[..6]));
    }

    #[test]
    fn bad_requests_are_refused() {
        let mut buf = [0u8; 512];
        let n = encode_request(&mut buf, 2, 0, 0, [0; 6], Some(b"abc"), None, b"").unwrap();
        assert_eq!(Request::parse(&buf[..n - 1]), Err(WireError::Length));
        assert_eq!(Request::parse(&buf[..10]), Err(WireError::Short));
        let mut many = buf;
        many[8..12].copy_from_slice(&0xfu32.to_le_bytes());
        assert_eq!(Request::parse(&many[..n]), Err(WireError::Fds));
        many[8..12].copy_from_slice(&0x40u32.to_le_bytes());
        assert_eq!(Request::parse(&many[..n]), Err(WireError::Fds));
        let mut bad = buf;
        bad[REQUEST_HEADER + 1] = 0;
        assert_eq!(Request::parse(&bad[..n]), Err(WireError::Path));
        bad = buf;
        bad[12..16].copy_from_slice(&(u32::MAX - 1).to_le_bytes());
        assert_eq!(Request::parse(&bad[..n]), Err(WireError::Path));
        bad = buf;
        bad[0] = 0;
        assert_eq!(Request::parse(&bad[..n]), Err(WireError::Magic));
    }

    #[test]
    fn hellos_name_a_descriptor() {
        assert_eq!(parse_hello(&encode_hello(961)), Some(961));
        assert_eq!(parse_hello(&encode_hello(-1)), None);
        assert_eq!(parse_hello(&HELLO), None);
        let mut h = encode_hello(5);
        h[0] = b'X';
        assert_eq!(parse_hello(&h), None);
    }

    #[test]
    fn hellos_may_name_their_thread() {
        let h = encode_hello_from(961, 4242);
        assert_eq!((parse_hello(&h), hello_thread(&h)), (Some(961), Some(4242)));
        assert_eq!(hello_thread(&encode_hello(961)), None);
        assert_eq!(hello_thread(&encode_hello_from(961, 0)), None);
        assert_eq!(hello_thread(&encode_hello_from(961, -5)), None);
        assert_eq!(hello_thread(&encode_hello_from(-1, 7)), None);
        assert_eq!(parse_hello(&h[..HELLO_LEN + 2]), None);
    }

    #[test]
    fn a_reply_round_trips() {
        let mut buf = [0u8; 64];
        encode_reply_header(&mut buf, -2, 1, 4);
        buf[REPLY_HEADER..REPLY_HEADER + 4].copy_from_slice(b"abcd");
        assert_eq!(parse_reply(&buf[..REPLY_HEADER + 4], 1), Some((-2, &b"abcd"[..])));
        assert_eq!(parse_reply(&buf[..REPLY_HEADER + 3], 1), None);
        assert_eq!(parse_reply(&buf[..REPLY_HEADER + 4], 0), None);
    }
}
