//! HTTP byte ranges (RFC 9110 §14): the `Range` header parsed and resolved against a
//! representation's length, and the `multipart/byteranges` body laid out.

/// Most ranges honoured in one request; a `Range` with more is ignored (the whole
/// representation is sent), as RFC 9110 §14.2 allows.
pub const MAX_RANGES: usize = 64;

/// A resolved byte range: `[start, start + len)`, never empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    /// First byte.
    pub start: u64,
    /// Bytes (≥ 1).
    pub len: u64,
}

impl ByteRange {
    /// The last byte, as `Content-Range` writes it.
    pub fn last(&self) -> u64 {
        self.start + self.len - 1
    }
}

/// What a `Range` header asks of a representation of a given length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ranges {
    /// No usable `Range`: absent, not `bytes`, malformed or too many ranges. Send all.
    Whole,
    /// Satisfiable ranges, in the order to send, overlapping ones merged.
    Partial(Vec<ByteRange>),
    /// Well-formed but nothing satisfiable: 416.
    Unsatisfiable,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spec {
    /// `first-last` (`last` absent: to the end).
    Int(u64, Option<u64>),
    /// `-n`: the last n bytes.
    Suffix(u64),
}

fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_specs(header: &str) -> Option<Vec<Spec>> {
    let (unit, set) = header.split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return None;
    }
    let mut specs = Vec::new();
    for item in set.split(',') {
        let item = item.trim_matches([' ', '\t']);
        if item.is_empty() {
            // `1#` lists allow empty elements between commas.
            continue;
        }
        if specs.len() == MAX_RANGES {
            return None;
        }
        let (first, last) = item.split_once('-')?;
        let spec = if first.is_empty() {
            Spec::Suffix(digits(last)?)
        } else {
            let first = digits(first)?;
            let last = if last.is_empty() { None } else { Some(digits(last)?) };
            if last.is_some_and(|l| l < first) {
                return None;
            }
            Spec::Int(first, last)
        };
        specs.push(spec);
    }
    (!specs.is_empty()).then_some(specs)
}

/// Resolves a `Range` header value against a representation of `len` bytes.
pub fn resolve(header: Option<&str>, len: u64) -> Ranges {
    let Some(specs) = header.and_then(parse_specs) else { return Ranges::Whole };
    let mut out: Vec<ByteRange> = specs
        .iter()
        .filter_map(|s| match *s {
            Spec::Int(first, _) if first >= len => None,
            Spec::Int(first, last) => {
                let last = last.map_or(len - 1, |l| l.min(len - 1));
                Some(ByteRange { start: first, len: last - first + 1 })
            }
            Spec::Suffix(0) => None,
            Spec::Suffix(_) if len == 0 => None,
            Spec::Suffix(n) => Some(ByteRange { start: len - n.min(len), len: n.min(len) }),
        })
        .collect();
    if out.is_empty() {
        return Ranges::Unsatisfiable;
    }
    // Overlapping ranges would make a client request the same bytes many times over for
    // one response: merge them (sorted), as §14.2 allows. Disjoint ranges keep the
    // client's order.
    let mut sorted = out.clone();
    sorted.sort_by_key(|r| r.start);
    if sorted.windows(2).any(|w| w[1].start < w[0].start + w[0].len) {
        out.clear();
        for r in sorted {
            match out.last_mut() {
                Some(p) if r.start <= p.start + p.len => {
                    let end = (p.start + p.len).max(r.start + r.len);
                    p.len = end - p.start;
                }
                _ => out.push(r),
            }
        }
    }
    Ranges::Partial(out)
}

/// One piece of a response body: bytes made here, or a range of the representation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// Bytes to send as they are (multipart framing).
    Bytes(Vec<u8>),
    /// `len` bytes of the representation from `offset`.
    Data {
        /// First byte of the representation.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

impl Segment {
    /// Bytes on the wire.
    pub fn wire_len(&self) -> u64 {
        match self {
            Segment::Bytes(b) => b.len() as u64,
            Segment::Data { len, .. } => *len,
        }
    }
}

/// The body of a `multipart/byteranges` response for `ranges` of a representation of
/// `total` bytes of type `content_type`, parts separated by `boundary` (RFC 9110
/// §14.6; RFC 2046 §5.1.1).
pub fn multipart(ranges: &[ByteRange], total: u64, content_type: &str, boundary: &str) -> Vec<Segment> {
    let mut out = Vec::with_capacity(ranges.len() * 2 + 1);
    for r in ranges {
        out.push(Segment::Bytes(
            format!(
                "\r\n--{boundary}\r\nContent-Type: {content_type}\r\nContent-Range: bytes {}-{}/{total}\r\n\r\n",
                r.start,
                r.last()
            )
            .into_bytes(),
        ));
        out.push(Segment::Data { offset: r.start, len: r.len });
    }
    out.push(Segment::Bytes(format!("\r\n--{boundary}--\r\n").into_bytes()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, len: u64) -> ByteRange {
        ByteRange { start, len }
    }

    #[test]
    fn single_and_suffix_and_open_ranges() {
        assert_eq!(resolve(Some("bytes=0-499"), 1000), Ranges::Partial(vec![r(0, 500)]));
        assert_eq!(resolve(Some("bytes=500-"), 1000), Ranges::Partial(vec![r(500, 500)]));
        assert_eq!(resolve(Some("bytes=-100"), 1000), Ranges::Partial(vec![r(900, 100)]));
        assert_eq!(resolve(Some("bytes=-5000"), 1000), Ranges::Partial(vec![r(0, 1000)]));
        assert_eq!(resolve(Some("bytes=990-5000"), 1000), Ranges::Partial(vec![r(990, 10)]));
        assert_eq!(resolve(Some("BYTES = 1-1"), 10), Ranges::Partial(vec![r(1, 1)]));
    }

    #[test]
    fn multiple_ranges_keep_order_unless_they_overlap() {
        assert_eq!(resolve(Some("bytes=500-599, 0-9"), 1000), Ranges::Partial(vec![r(500, 100), r(0, 10)]));
        assert_eq!(resolve(Some("bytes=0-99,50-149,-10"), 1000), Ranges::Partial(vec![r(0, 150), r(990, 10)]));
        assert_eq!(resolve(Some("bytes=0-9,10-19"), 1000), Ranges::Partial(vec![r(0, 10), r(10, 10)]));
        assert_eq!(resolve(Some("bytes=0-0,0-0,0-0"), 1000), Ranges::Partial(vec![r(0, 1)]));
    }

    #[test]
    fn unsatisfiable_and_malformed() {
        assert_eq!(resolve(Some("bytes=1000-"), 1000), Ranges::Unsatisfiable);
        assert_eq!(resolve(Some("bytes=-0"), 1000), Ranges::Unsatisfiable);
        assert_eq!(resolve(Some("bytes=0-"), 0), Ranges::Unsatisfiable);
        assert_eq!(resolve(Some("bytes=5000-6000, 2000-"), 1000), Ranges::Unsatisfiable);
        for bad in
            ["bytes=5-4", "bytes=a-b", "items=0-1", "bytes=", "bytes=-", "bytes 0-1", "bytes=99999999999999999999-"]
        {
            assert_eq!(resolve(Some(bad), 1000), Ranges::Whole, "{bad}");
        }
        let many =
            format!("bytes={}", (0..=MAX_RANGES).map(|i| format!("{}-{}", i * 2, i * 2)).collect::<Vec<_>>().join(","));
        assert_eq!(resolve(Some(&many), 1 << 20), Ranges::Whole);
    }

    #[test]
    fn multipart_layout() {
        let parts = multipart(&[r(0, 2), r(8, 2)], 10, "video/mp2t", "XYZ");
        let mut wire = Vec::new();
        let data = b"0123456789";
        for p in &parts {
            match p {
                Segment::Bytes(b) => wire.extend_from_slice(b),
                Segment::Data { offset, len } => {
                    wire.extend_from_slice(&data[*offset as usize..(*offset + *len) as usize])
                }
            }
        }
        let expect = "\r\n--XYZ\r\nContent-Type: video/mp2t\r\nContent-Range: bytes 0-1/10\r\n\r\n01\
                      \r\n--XYZ\r\nContent-Type: video/mp2t\r\nContent-Range: bytes 8-9/10\r\n\r\n89\r\n--XYZ--\r\n";
        assert_eq!(String::from_utf8(wire).unwrap(), expect);
        assert_eq!(parts.iter().map(Segment::wire_len).sum::<u64>(), expect.len() as u64);
    }
}
