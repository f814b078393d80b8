//! The nodes' line protocol (`HELLO`, `BEAT`, `OPEN`; see [`crate::service`]), read and
//! written in one place. A node's lines are untrusted input to the director: [`parse`]
//! takes one line's bytes and gives a checked [`NodeLine`] or says what is wrong with it;
//! the writers refuse what a reader would misread (a clip name with a space in it would
//! become two clips). Fuzzed: `fuzz/fuzz_targets/mars_node_line.rs` runs [`fuzz_line`].

use std::fmt::Write as _;
use std::net::SocketAddr;

use crate::StreamId;

/// Longest line a node may send, its `\n` included (its cached clips' names).
pub const MAX_LINE: usize = 64 << 10;

/// One line a node sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeLine<'a> {
    /// `HELLO <id> <host:port> <capacity bytes/s>`: the node registers (first line only).
    Hello {
        /// The node's id.
        id: u32,
        /// Where players reach it (HTTP).
        http: SocketAddr,
        /// Bytes/s it can send; never 0.
        capacity: u64,
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
            let (Some(id), Some(http), Some(cap), None) = (words.next(), words.next(), words.next(), words.next())
            else {
                return Err(bad);
            };
            let id = id.parse::<u32>().map_err(|_| bad)?;
            let http = http.parse::<SocketAddr>().map_err(|_| bad)?;
            let capacity = cap.parse::<u64>().map_err(|_| bad)?;
            if capacity == 0 {
                return Err(bad);
            }
            Ok(NodeLine::Hello { id, http, capacity })
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

/// The `HELLO` line, `\n` included (a capacity of 0 is said as 1: the director refuses 0).
pub fn hello(id: u32, http: SocketAddr, capacity: u64) -> String {
    format!("HELLO {id} {http} {}\n", capacity.max(1))
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
/// bytes either refuse or parse into a line that the writers say again, and that reads
/// back the same.
pub fn fuzz_line(data: &[u8]) {
    let Ok(line) = parse(data) else { return };
    let again = match &line {
        NodeLine::Hello { id, http, capacity } => hello(*id, *http, *capacity),
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
        assert_eq!(parse(b"HELLO 3 10.0.0.2:8080 1000"), Ok(NodeLine::Hello { id: 3, http: a, capacity: 1000 }));
        assert_eq!(parse(b"BEAT 2 a.ts  b.ts"), Ok(NodeLine::Beat { connections: 2, clips: vec!["a.ts", "b.ts"] }));
        assert_eq!(parse(b"BEAT 0"), Ok(NodeLine::Beat { connections: 0, clips: vec![] }));
        assert_eq!(parse(b"OPEN"), Ok(NodeLine::Open(vec![])));
        assert_eq!(parse(b"OPEN 7 9"), Ok(NodeLine::Open(vec![StreamId(7), StreamId(9)])));
    }

    #[test]
    fn bad_lines_are_refused_with_why() {
        assert_eq!(parse(b"HELLO 3 nowhere 5"), Err(LineError::Malformed("HELLO")));
        assert_eq!(parse(b"HELLO 3 127.0.0.1:1 0"), Err(LineError::Malformed("HELLO")));
        assert_eq!(parse(b"HELLO 3 127.0.0.1:1 5 extra"), Err(LineError::Malformed("HELLO")));
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
        assert_eq!(hello(1, "127.0.0.1:9".parse().unwrap(), 0), "HELLO 1 127.0.0.1:9 1\n");
    }

    proptest! {
        #[test]
        fn what_is_written_reads_back(
            id: u32, port: u16, v6: bool, cap in 1u64.., conns: u64,
            clips in proptest::collection::vec("[!-~]{1,12}", 0..20),
            streams in proptest::collection::vec(any::<u64>(), 0..50),
        ) {
            let http: SocketAddr = if v6 { format!("[::1]:{port}") } else { format!("127.0.0.1:{port}") }.parse().unwrap();
            for line in [hello(id, http, cap), beat(conns, &clips), open(&streams).unwrap()] {
                fuzz_line(&line.as_bytes()[..line.len() - 1]);
            }
            let b = beat(conns, &clips);
            prop_assert_eq!(
                parse(&b.as_bytes()[..b.len() - 1]),
                Ok(NodeLine::Beat { connections: conns, clips: clips.iter().map(String::as_str).collect() })
            );
        }

        #[test]
        fn any_bytes_are_refused_or_read_back(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            fuzz_line(&data);
        }
    }
}
