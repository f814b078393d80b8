//! The nodes' line protocol (`HELLO`, `BEAT`, `OPEN`; see [`crate::service`]) and the
//! director's answers to a node (`NONCE`, `WELCOME`, `REFUSED`), read and written in one
//! place.
//!
//! **Registration is a challenge–response**: on a new connection the director says
//! `NONCE <64 hex>` (32 fresh random bytes); the node's `HELLO` ends with the
//! HMAC-SHA256, under the cluster key ([`ClusterKey`]), of the nonce and the HELLO's
//! fields ([`hello_mac`]); the director checks it in constant time ([`verify_hello`]) and
//! answers `WELCOME` or `REFUSED <why>` and hangs up. A captured HELLO is worth nothing
//! on another connection: its nonce is another. A node's lines are untrusted input to the director: [`parse`]
//! takes one line's bytes and gives a checked [`NodeLine`] or says what is wrong with it;
//! the writers refuse what a reader would misread (a clip name with a space in it would
//! become two clips). Fuzzed: `fuzz/fuzz_targets/mars_node_line.rs` runs [`fuzz_line`].

use std::fmt::Write as _;
use std::net::SocketAddr;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::key::ClusterKey;
use crate::StreamId;

/// Bytes of a nonce and of a MAC.
pub const NONCE_LEN: usize = 32;
/// What the MAC is over first (the protocol's version: a MAC of another protocol or
/// version never verifies here).
const MAC_DOMAIN: &[u8] = b"ictus-mars-node-hello-v1\0";

/// Longest line a node may send, its `\n` included (its cached clips' names).
pub const MAX_LINE: usize = 64 << 10;

/// One line a node sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeLine<'a> {
    /// `HELLO <id> <host:port> <capacity bytes/s> <mac hex>`: the node registers (first
    /// line only); the MAC is [`hello_mac`]'s.
    Hello {
        /// The node's id.
        id: u32,
        /// Where players reach it (HTTP).
        http: SocketAddr,
        /// Bytes/s it can send; never 0.
        capacity: u64,
        /// HMAC-SHA256 of the director's nonce and the fields above.
        mac: [u8; NONCE_LEN],
    },
    /// `BEAT <connections> <clip>…`: alive; its connections and the clips it has cached.
    Beat {
        /// Open connections.
        connections: u64,
        /// Clips with stripes in its cache (each a [`clip_name_ok`] word).
        clips: Vec<&'a str>,
    },
    /// `OPEN <stream>…`: the director's streams it is sending now.
    Open(Vec<StreamId>),
}

/// One line the director sends a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirectorLine {
    /// `NONCE <64 hex>`: the first line on every node connection.
    Nonce([u8; NONCE_LEN]),
    /// `WELCOME`: the HELLO's MAC was right; the node is registered.
    Welcome,
    /// `REFUSED <why>`: the registration was refused; the director hangs up.
    Refused(String),
}

/// Why a node's line was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// Longer than [`MAX_LINE`].
    #[error("a line longer than {MAX_LINE} bytes")]
    TooLong,
    /// Not UTF-8.
    #[error("a line that is not UTF-8")]
    NotUtf8,
    /// A verb the protocol does not have.
    #[error("an unknown verb")]
    Verb,
    /// The verb's words are wrong (missing, extra, not numbers, a bad address).
    #[error("a malformed {0} line")]
    Malformed(&'static str),
    /// A HELLO without its MAC (a node of an older version, or one without the key).
    #[error("a HELLO without a MAC")]
    NoMac,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// 64 lowercase hex digits as 32 bytes (what [`hex`] writes; anything else is refused,
/// so what is accepted is said again the same).
fn unhex(w: &str) -> Option<[u8; NONCE_LEN]> {
    let w = w.as_bytes();
    if w.len() != 2 * NONCE_LEN {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; NONCE_LEN];
    for (o, pair) in out.iter_mut().zip(w.chunks_exact(2)) {
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// The MAC a node puts in its HELLO: HMAC-SHA256 under `key` of a domain string, the
/// director's `nonce`, and the HELLO's fields as [`hello`] writes them (one canonical
/// text: what the director parsed, said again, is what was signed).
pub fn hello_mac(
    key: &ClusterKey,
    nonce: &[u8; NONCE_LEN],
    id: u32,
    http: SocketAddr,
    capacity: u64,
) -> [u8; NONCE_LEN] {
    hello_hmac(key, nonce, id, http, capacity).finalize().into_bytes().into()
}

fn hello_hmac(key: &ClusterKey, nonce: &[u8; NONCE_LEN], id: u32, http: SocketAddr, capacity: u64) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key.bytes()).expect("HMAC takes any key length");
    m.update(MAC_DOMAIN);
    m.update(nonce);
    m.update(format!("HELLO {id} {http} {capacity}").as_bytes());
    m
}

/// Whether a parsed HELLO's MAC is right for `nonce` under `key`, compared in constant
/// time (`hmac`'s `verify_slice`). Any other line is not a right HELLO.
pub fn verify_hello(key: &ClusterKey, nonce: &[u8; NONCE_LEN], line: &NodeLine<'_>) -> bool {
    let NodeLine::Hello { id, http, capacity, mac } = line else { return false };
    hello_hmac(key, nonce, *id, *http, *capacity).verify_slice(mac).is_ok()
}

/// Parses one line the director sent, without its `\n`.
pub fn parse_director(line: &[u8]) -> Result<DirectorLine, LineError> {
    if line.len() >= MAX_LINE {
        return Err(LineError::TooLong);
    }
    let text = std::str::from_utf8(line).map_err(|_| LineError::NotUtf8)?;
    if text.contains('\n') {
        return Err(LineError::Malformed("multi-line"));
    }
    match text.split_once(' ').unwrap_or((text, "")) {
        ("NONCE", w) => unhex(w).map(DirectorLine::Nonce).ok_or(LineError::Malformed("NONCE")),
        ("WELCOME", "") if text == "WELCOME" => Ok(DirectorLine::Welcome),
        ("REFUSED", why) if !why.is_empty() => Ok(DirectorLine::Refused(why.to_string())),
        ("REFUSED", _) => Err(LineError::Malformed("REFUSED")),
        _ => Err(LineError::Verb),
    }
}

/// The director's line, `\n` included (a `REFUSED` reason's line ends become spaces, an
/// empty one says `refused`).
pub fn director_line(l: &DirectorLine) -> String {
    match l {
        DirectorLine::Nonce(n) => format!("NONCE {}\n", hex(n)),
        DirectorLine::Welcome => "WELCOME\n".to_string(),
        DirectorLine::Refused(why) => {
            let why = if why.is_empty() { "refused".to_string() } else { why.replace('\n', " ") };
            let mut w = format!("REFUSED {why}");
            w.truncate(MAX_LINE / 2);
            while !w.is_char_boundary(w.len()) {
                w.pop();
            }
            w + "\n"
        }
    }
}

/// Whether `name` can be said in a `BEAT` line: not empty, no space, no line end.
pub fn clip_name_ok(name: &str) -> bool {
    !name.is_empty() && !name.contains([' ', '\n'])
}

/// Parses one line, without its `\n`.
pub fn parse(line: &[u8]) -> Result<NodeLine<'_>, LineError> {
    if line.len() >= MAX_LINE {
        return Err(LineError::TooLong);
    }
    let text = std::str::from_utf8(line).map_err(|_| LineError::NotUtf8)?;
    if text.contains('\n') {
        return Err(LineError::Malformed("multi-line"));
    }
    let mut words = text.split(' ');
    match words.next() {
        Some("HELLO") => {
            let bad = LineError::Malformed("HELLO");
            let (Some(id), Some(http), Some(cap), mac, None) =
                (words.next(), words.next(), words.next(), words.next(), words.next())
            else {
                return Err(bad);
            };
            let id = id.parse::<u32>().map_err(|_| bad)?;
            let http = http.parse::<SocketAddr>().map_err(|_| bad)?;
            let capacity = cap.parse::<u64>().map_err(|_| bad)?;
            if capacity == 0 {
                return Err(bad);
            }
            let mac = unhex(mac.ok_or(LineError::NoMac)?).ok_or(bad)?;
            Ok(NodeLine::Hello { id, http, capacity, mac })
        }
        Some("BEAT") => {
            let connections = words.next().and_then(|w| w.parse::<u64>().ok()).ok_or(LineError::Malformed("BEAT"))?;
            Ok(NodeLine::Beat { connections, clips: words.filter(|w| !w.is_empty()).collect() })
        }
        Some("OPEN") => words
            .filter(|w| !w.is_empty())
            .map(|w| w.parse::<u64>().map(StreamId))
            .collect::<Result<Vec<_>, _>>()
            .map(NodeLine::Open)
            .map_err(|_| LineError::Malformed("OPEN")),
        _ => Err(LineError::Verb),
    }
}

/// The `HELLO` line, `\n` included, signed with `key` for the director's `nonce` (a
/// capacity of 0 is said as 1: the director refuses 0).
pub fn hello(key: &ClusterKey, nonce: &[u8; NONCE_LEN], id: u32, http: SocketAddr, capacity: u64) -> String {
    let capacity = capacity.max(1);
    hello_with_mac(id, http, capacity, &hello_mac(key, nonce, id, http, capacity))
}

/// The `HELLO` line with the MAC given (what [`hello`] writes; the fuzz check says again
/// what it read).
pub fn hello_with_mac(id: u32, http: SocketAddr, capacity: u64, mac: &[u8; NONCE_LEN]) -> String {
    format!("HELLO {id} {http} {} {}\n", capacity.max(1), hex(mac))
}

/// The `BEAT` line, `\n` included, with as many of `clips` as fit in [`MAX_LINE`] in
/// their order; names that cannot be said ([`clip_name_ok`]) are left out.
pub fn beat<S: AsRef<str>>(connections: u64, clips: &[S]) -> String {
    let mut line = format!("BEAT {connections}");
    for c in clips.iter().map(AsRef::as_ref).filter(|c| clip_name_ok(c)) {
        if line.len() + 1 + c.len() + 1 > MAX_LINE {
            break;
        }
        line.push(' ');
        line.push_str(c);
    }
    line.push('\n');
    line
}

/// The `OPEN` line, `\n` included, or `None` if the streams do not fit in one line: an
/// `OPEN` cut short would close the streams it left out, so none is sent then.
pub fn open(streams: &[u64]) -> Option<String> {
    let mut line = String::from("OPEN");
    for s in streams {
        let _ = write!(line, " {s}");
    }
    line.push('\n');
    (line.len() <= MAX_LINE).then_some(line)
}

/// The fuzz target's check (also replayed on stable by `tests/fuzz_corpus.rs`): any
/// bytes either refuse or parse into a line (a node's, or the director's) that the
/// writers say again, and that reads back the same; a HELLO accepted is one whose MAC
/// verifies only for the nonce and key it was made with.
pub fn fuzz_line(data: &[u8]) {
    if let Ok(d) = parse_director(data) {
        let again = director_line(&d);
        assert!(again.len() <= MAX_LINE && again.ends_with('\n'));
        assert_eq!(parse_director(&again.as_bytes()[..again.len() - 1]), Ok(d), "said again, read the same");
    }
    let Ok(line) = parse(data) else { return };
    let again = match &line {
        NodeLine::Hello { id, http, capacity, mac } => {
            // Bytes from the fuzzer carry no right MAC (for this key and nonce, a
            // forgery); the same fields signed do, and only for their nonce.
            let key = ClusterKey::from_bytes(&[7u8; 32]).expect("a key");
            let (n1, n2) = ([1u8; NONCE_LEN], [2u8; NONCE_LEN]);
            let signed = hello(&key, &n1, *id, *http, *capacity);
            let s = parse(&signed.as_bytes()[..signed.len() - 1]).expect("a signed HELLO reads");
            assert!(verify_hello(&key, &n1, &s) && !verify_hello(&key, &n2, &s), "a MAC is for its nonce");
            assert!(!verify_hello(&key, &n1, &line) || s == line, "a MAC verifies only what was signed");
            hello_with_mac(*id, *http, *capacity, mac)
        }
        NodeLine::Beat { connections, clips } => {
            assert!(clips.iter().all(|c| clip_name_ok(c)), "parsed clips are sayable");
            beat(*connections, clips)
        }
        NodeLine::Open(s) => {
            open(&s.iter().map(|s| s.0).collect::<Vec<_>>()).expect("what was read in one line is said in one")
        }
    };
    assert!(again.len() <= MAX_LINE && again.ends_with('\n'));
    assert_eq!(parse(&again.as_bytes()[..again.len() - 1]).as_ref(), Ok(&line), "said again, read the same");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn good_lines_parse() {
        let a: SocketAddr = "10.0.0.2:8080".parse().unwrap();
        let mac = format!(" {}", "0f".repeat(32));
        assert_eq!(
            parse(format!("HELLO 3 10.0.0.2:8080 1000{mac}").as_bytes()),
            Ok(NodeLine::Hello { id: 3, http: a, capacity: 1000, mac: [0x0f; 32] })
        );
        assert_eq!(
            parse_director(format!("NONCE {}", "a0".repeat(32)).as_bytes()),
            Ok(DirectorLine::Nonce([0xa0; 32]))
        );
        assert_eq!(parse_director(b"WELCOME"), Ok(DirectorLine::Welcome));
        assert_eq!(parse_director(b"REFUSED bad MAC"), Ok(DirectorLine::Refused("bad MAC".into())));
        assert_eq!(parse(b"BEAT 2 a.ts  b.ts"), Ok(NodeLine::Beat { connections: 2, clips: vec!["a.ts", "b.ts"] }));
        assert_eq!(parse(b"BEAT 0"), Ok(NodeLine::Beat { connections: 0, clips: vec![] }));
        assert_eq!(parse(b"OPEN"), Ok(NodeLine::Open(vec![])));
        assert_eq!(parse(b"OPEN 7 9"), Ok(NodeLine::Open(vec![StreamId(7), StreamId(9)])));
    }

    #[test]
    fn bad_lines_are_refused_with_why() {
        let mac = "0f".repeat(32);
        assert_eq!(parse(format!("HELLO 3 nowhere 5 {mac}").as_bytes()), Err(LineError::Malformed("HELLO")));
        assert_eq!(parse(format!("HELLO 3 127.0.0.1:1 0 {mac}").as_bytes()), Err(LineError::Malformed("HELLO")));
        assert_eq!(parse(format!("HELLO 3 127.0.0.1:1 5 {mac} x").as_bytes()), Err(LineError::Malformed("HELLO")));
        assert_eq!(parse(b"HELLO 3 127.0.0.1:1 5"), Err(LineError::NoMac));
        for bad in ["0F".repeat(32), "0f".repeat(31), "0f".repeat(33), "zz".repeat(32), "+f".repeat(32)] {
            assert_eq!(parse(format!("HELLO 3 127.0.0.1:1 5 {bad}").as_bytes()), Err(LineError::Malformed("HELLO")));
        }
        for bad in ["NONCE", "NONCE ", "WELCOME now", "REFUSED", "REFUSED ", "HELLO"] {
            assert!(parse_director(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert_eq!(parse_director(format!("NONCE {}", "A0".repeat(32)).as_bytes()), Err(LineError::Malformed("NONCE")));
        assert_eq!(
            parse(format!("HELLO 3 127.0.0.1:1 {}", "9".repeat(30)).as_bytes()),
            Err(LineError::Malformed("HELLO"))
        );
        assert_eq!(parse(b"BEAT lots"), Err(LineError::Malformed("BEAT")));
        assert_eq!(parse(b"OPEN 1 x"), Err(LineError::Malformed("OPEN")));
        assert_eq!(parse(b"BYE"), Err(LineError::Verb));
        assert_eq!(parse(b""), Err(LineError::Verb));
        assert_eq!(parse(&[b'B', 0xff]), Err(LineError::NotUtf8));
        assert_eq!(parse(&vec![b'x'; MAX_LINE]), Err(LineError::TooLong));
    }

    #[test]
    fn writers_leave_out_what_would_be_misread() {
        assert_eq!(beat(1, &["a b", "", "c\nOPEN 5", "d.ts"]), "BEAT 1 d.ts\n");
        let many: Vec<String> = (0..20_000).map(|i| format!("clip-{i}.ts")).collect();
        let l = beat(0, &many);
        assert!(l.len() <= MAX_LINE);
        let NodeLine::Beat { clips, .. } = parse(&l.as_bytes()[..l.len() - 1]).unwrap() else { panic!() };
        assert_eq!(clips, many[..clips.len()].iter().map(String::as_str).collect::<Vec<_>>(), "a prefix, in order");
        assert!(open(&vec![u64::MAX; 4000]).is_none(), "too many streams for one line: none");
        assert_eq!(open(&[]).as_deref(), Some("OPEN\n"));
        let key = ClusterKey::from_bytes(&[1; 32]).unwrap();
        assert!(hello(&key, &[0; 32], 1, "127.0.0.1:9".parse().unwrap(), 0).starts_with("HELLO 1 127.0.0.1:9 1 "));
        assert_eq!(director_line(&DirectorLine::Refused("a\nb".into())), "REFUSED a b\n");
        assert_eq!(director_line(&DirectorLine::Refused(String::new())), "REFUSED refused\n");
    }

    proptest! {
        #[test]
        fn what_is_written_reads_back(
            id: u32, port: u16, v6: bool, cap in 1u64.., conns: u64,
            clips in proptest::collection::vec("[!-~]{1,12}", 0..20),
            streams in proptest::collection::vec(any::<u64>(), 0..50),
        ) {
            let http: SocketAddr = if v6 { format!("[::1]:{port}") } else { format!("127.0.0.1:{port}") }.parse().unwrap();
            let key = ClusterKey::from_bytes(&[3; 40]).unwrap();
            for line in [hello(&key, &[9; 32], id, http, cap), beat(conns, &clips), open(&streams).unwrap()] {
                fuzz_line(&line.as_bytes()[..line.len() - 1]);
            }
            let b = beat(conns, &clips);
            prop_assert_eq!(
                parse(&b.as_bytes()[..b.len() - 1]),
                Ok(NodeLine::Beat { connections: conns, clips: clips.iter().map(String::as_str).collect() })
            );
        }

        /// A HELLO's MAC verifies for its key and nonce only, and for its fields only.
        #[test]
        fn a_mac_binds_key_nonce_and_fields(
            id: u32, port: u16, cap in 1u64.., n1: [u8; 32], n2: [u8; 32],
            k1 in proptest::collection::vec(any::<u8>(), 32..80), k2 in proptest::collection::vec(any::<u8>(), 32..80),
        ) {
            let http: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let (a, b) = (ClusterKey::from_bytes(&k1).unwrap(), ClusterKey::from_bytes(&k2).unwrap());
            let l = hello(&a, &n1, id, http, cap);
            let p = parse(&l.as_bytes()[..l.len() - 1]).unwrap();
            prop_assert!(verify_hello(&a, &n1, &p));
            prop_assert_eq!(verify_hello(&a, &n2, &p), n1 == n2, "another nonce: a replay");
            prop_assert_eq!(verify_hello(&b, &n1, &p), k1 == k2, "another key");
            let NodeLine::Hello { mac, .. } = p else { unreachable!() };
            let other: SocketAddr = format!("127.0.0.1:{}", port.wrapping_add(1)).parse().unwrap();
            for forged in [
                NodeLine::Hello { id: id.wrapping_add(1), http, capacity: cap, mac },
                NodeLine::Hello { id, http: other, capacity: cap, mac },
                NodeLine::Hello { id, http, capacity: cap.wrapping_add(1).max(1), mac },
            ] {
                prop_assert!(!verify_hello(&a, &n1, &forged), "changed fields keep no MAC: {:?}", forged);
            }
        }

        #[test]
        fn any_bytes_are_refused_or_read_back(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            fuzz_line(&data);
        }
    }
}
