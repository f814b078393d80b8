//! The checks of the fuzz targets (`fuzz/fuzz_targets/mars_*.rs`), here so that the
//! targets and the stable replay of their seed corpora (`tests/fuzz_corpus.rs`) run the
//! same code. Each takes arbitrary bytes, must not panic except on a broken invariant,
//! and asserts what must hold of anything the parser accepts.

use crate::http::{self, Catalog, Parsed, Resource};
use crate::label::Label;
use crate::range::Segment;

struct One(u64);

impl Catalog for One {
    fn lookup(&self, name: &str) -> Option<Resource> {
        (name == "clip.ts" || name.starts_with('a')).then(|| Resource::Stream { len: self.0, etag: "\"e1\"".into() })
    }
}

/// HTTP request handling: the first 2 bytes pick the stream's length, the rest is what
/// a client sent. Checks the response plan against the head it declares.
pub fn http_request(data: &[u8]) {
    let (len, bytes) = match data {
        [a, b, rest @ ..] => (u64::from(u16::from_le_bytes([*a, *b])) * 97, rest),
        _ => (0, data),
    };
    match http::parse(bytes) {
        Parsed::Partial => assert!(bytes.len() < http::MAX_HEAD),
        Parsed::Refuse(status) => {
            assert!((400..=505).contains(&status));
            let plan = http::refusal(bytes, status);
            assert!(!plan.keep_alive, "a refusal closes");
            // A request line may follow empty lines (RFC 9112 §2.2), nothing else.
            let line = &bytes[bytes.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(bytes.len())..];
            assert!(plan.body.is_empty() || !line.starts_with(b"HEAD "), "no body to a HEAD");
        }
        Parsed::Request(req, n) => {
            assert!(n <= bytes.len() && n <= http::MAX_HEAD);
            let plan = http::respond(&req, &One(len), "BOUNDARY");
            let head = String::from_utf8(plan.head.clone()).expect("heads are ASCII");
            assert!(head.starts_with("HTTP/1.1 ") && head.ends_with("\r\n\r\n"));
            let declared: Option<u64> =
                head.lines().find_map(|l| l.strip_prefix("Content-Length: ")).and_then(|v| v.trim().parse().ok());
            if req.method == http::Method::Get && plan.status != 304 {
                assert_eq!(declared, Some(plan.body_len()), "Content-Length matches the body");
            } else if req.method == http::Method::Head {
                assert!(plan.body.is_empty());
            }
            for s in &plan.body {
                if let Segment::Data { offset, len: n } = s {
                    assert!(*n > 0 && offset + n <= len, "data inside the stream");
                }
            }
        }
    }
}

/// The volume label: anything that decodes is valid, encodes to the same bytes'
/// meaning, and maps its streams inside the volume.
pub fn label(data: &[u8]) {
    let Ok(l) = Label::decode(data) else { return };
    l.validate().expect("a decoded label is valid");
    let again = Label::decode(&l.encode().expect("a valid label encodes")).expect("and decodes");
    assert_eq!(again, l);
    for s in &l.streams {
        let covered: u64 = l.geometry.map(s.start, s.len.min(1 << 20)).map(|p| p.len).sum();
        assert_eq!(covered, s.len.min(1 << 20));
    }
}
