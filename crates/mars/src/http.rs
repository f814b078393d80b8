//! HTTP/1.1 requests from players, as a pure function: untrusted bytes in, a response
//! plan out (status line and headers, then body segments that name ranges of a stream).
//! The server shell moves the bytes; everything that decides what to send is here, so
//! the fuzz target and the unit tests cover it without sockets.
//!
//! Parsing is `httparse`'s (a request head of at most [`MAX_HEAD`] bytes and
//! [`MAX_HEADERS`] fields); what it accepts is then checked: method `GET` or `HEAD`
//! (405 otherwise), `Host` present in HTTP/1.1 (400), no request body (400: a player never
//! sends one, and refusing it means no body framing to get wrong), a path that is a
//! valid stream name ([`crate::label::valid_name`]; 404 otherwise).
//!
//! What RFC 9110/9112 ask of an origin server, and what a hostile client tries:
//! - the target in origin form (`/NAME`) or absolute form (`http://HOST/NAME`, which a
//!   server MUST accept, RFC 9112 §3.2.2); `*` and authority form are 400. A fragment
//!   (`#`) is not part of a request target (400).
//! - percent-encoded unreserved characters are the characters (RFC 3986 §6.2.2.2), so
//!   `/clip%2Ets` names `clip.ts`; any other encoded octet (`%2F`, `%00`, …) stays
//!   encoded and names nothing (404), so no encoding reaches past the stream names a
//!   plain path can say; a `%` not followed by two hex digits is 400.
//! - HTTP/1.x with x > 1 is served as HTTP/1.1 (RFC 9110 §2.5); other versions 505.
//! - one `Host` of valid characters (400 otherwise); `Content-Length` other than 0 and
//!   any `Transfer-Encoding` are 400 (no request body is read, so none can be framed
//!   wrongly); a request line longer than [`MAX_HEAD`] is 414, a longer head 431.
//! - repeated `Range`/`If-Range` lines are combined as a list (RFC 9110 §5.3), which makes
//!   them invalid, so the whole representation is sent; `If-None-Match` lines combine.
//! - the query parameters the server reads (`rate`, `lead`, `stream`) must be decimal
//!   numbers (`rate` above 0) and said at most once: 400 otherwise, never a silent
//!   full-speed download for a misspelt rate.

use crate::label::valid_name;
use crate::range::{self, ByteRange, Ranges, Segment};

/// Largest request head (request line and headers) accepted; past it, 431.
pub const MAX_HEAD: usize = 8 << 10;
/// Most header fields accepted; past it, 431.
pub const MAX_HEADERS: usize = 32;

/// Request methods served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `HEAD`.
    Head,
}

/// A validated request head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    /// The method.
    pub method: Method,
    /// The path without its leading `/` and query (not yet checked as a name).
    pub path: String,
    /// The query, without its `?`.
    pub query: Option<String>,
    /// HTTP/1.x's minor version.
    pub minor: u8,
    /// `Range`, if present (the last one, if several).
    pub range: Option<String>,
    /// `If-Range`, if present.
    pub if_range: Option<String>,
    /// `If-None-Match`, if present.
    pub if_none_match: Option<String>,
    /// Whether the client wants the connection kept open.
    pub keep_alive: bool,
}

/// Result of reading a request head from a buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Not all of the head has arrived (and the buffer is below [`MAX_HEAD`]).
    Partial,
    /// A head of `len` bytes.
    Request(RequestHead, usize),
    /// A request to refuse with this status, then close.
    Refuse(u16),
}

/// Reads one request head from the start of `buf`.
pub fn parse(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return if buf.len() < MAX_HEAD {
                Parsed::Partial
            } else if request_line_unended(buf) {
                Parsed::Refuse(414)
            } else {
                Parsed::Refuse(431)
            };
        }
        Err(httparse::Error::TooManyHeaders) => return Parsed::Refuse(431),
        Err(httparse::Error::Version) => {
            // HTTP/1.2 and later minors are served as HTTP/1.1 (RFC 9110 §2.5);
            // httparse knows only 1.0 and 1.1.
            return match later_minor(buf) {
                Some(at) => {
                    let mut copy = buf.to_vec();
                    copy[at] = b'1';
                    match parse(&copy) {
                        Parsed::Request(r, n) => Parsed::Request(r, n),
                        other => other,
                    }
                }
                None if names_a_version(buf) => Parsed::Refuse(505),
                None => Parsed::Refuse(400),
            };
        }
        Err(_) => return Parsed::Refuse(400),
    };
    if len > MAX_HEAD {
        return Parsed::Refuse(if request_line_unended(&buf[..MAX_HEAD]) { 414 } else { 431 });
    }
    let (Some(method), Some(path), Some(minor)) = (req.method, req.path, req.version) else {
        return Parsed::Refuse(400);
    };
    let method = match method {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        _ => return Parsed::Refuse(405),
    };
    let mut host = false;
    let mut range = None;
    let mut if_range = None;
    let mut if_none_match = None;
    let mut connection_close = false;
    let mut connection_keep_alive = false;
    for h in req.headers.iter() {
        let Ok(value) = std::str::from_utf8(h.value) else {
            // Obsolete text in a field we read would be ambiguous; in others it is harmless.
            if ["range", "if-range", "if-none-match", "connection", "host"]
                .iter()
                .any(|n| h.name.eq_ignore_ascii_case(n))
            {
                return Parsed::Refuse(400);
            }
            continue;
        };
        let name = h.name;
        if name.eq_ignore_ascii_case("host") {
            if host || !valid_host(value.trim()) {
                return Parsed::Refuse(400);
            }
            host = true;
        } else if name.eq_ignore_ascii_case("range") {
            combine(&mut range, value.trim());
        } else if name.eq_ignore_ascii_case("if-range") {
            combine(&mut if_range, value.trim());
        } else if name.eq_ignore_ascii_case("if-none-match") {
            combine(&mut if_none_match, value.trim());
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                connection_close |= token.eq_ignore_ascii_case("close");
                connection_keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || (name.eq_ignore_ascii_case("content-length") && !zero_length(value))
        {
            return Parsed::Refuse(400);
        }
    }
    if minor >= 1 && !host {
        return Parsed::Refuse(400);
    }
    let keep_alive = if minor >= 1 { !connection_close } else { connection_keep_alive && !connection_close };
    if path.contains('#') {
        return Parsed::Refuse(400);
    }
    let (path, query) = match path.split_once('?') {
        Some((p, q)) => (p, Some(q.to_string())),
        None => (path, None),
    };
    let Some(path) = origin_path(path) else {
        // Asterisk form (OPTIONS) and authority form (CONNECT) are not for us.
        return Parsed::Refuse(400);
    };
    let Some(path) = decode_unreserved(path) else { return Parsed::Refuse(400) };
    if let Some(q) = &query {
        if !valid_params(q) {
            return Parsed::Refuse(400);
        }
    }
    Parsed::Request(RequestHead { method, path, query, minor, range, if_range, if_none_match, keep_alive }, len)
}

/// A field said on several lines is one comma-separated list (RFC 9110 §5.3).
fn combine(field: &mut Option<String>, value: &str) {
    match field {
        Some(f) => {
            f.push_str(", ");
            f.push_str(value);
        }
        None => *field = Some(value.to_string()),
    }
}

/// Whether a `Content-Length` value says no body: `0`, `00`, or a list of such (a
/// repeated field, RFC 9112 §6.3).
fn zero_length(value: &str) -> bool {
    value.split(',').map(|v| v.trim_matches([' ', '\t'])).all(|v| !v.is_empty() && v.bytes().all(|b| b == b'0'))
}

/// Whether a `Host` value is `uri-host [ ":" port ]` as far as its characters go
/// (RFC 9112 §3.2: a Host with an invalid value is 400). Empty is valid.
fn valid_host(value: &str) -> bool {
    value.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%:[]".contains(&b))
}

/// The path of a request target in origin form (`/p`) or absolute form
/// (`http://host/p`, scheme any case), without its leading `/`.
fn origin_path(target: &str) -> Option<&str> {
    if let Some(p) = target.strip_prefix('/') {
        return Some(p);
    }
    let (scheme, rest) = target.split_once("://")?;
    if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
        return None;
    }
    match rest.find('/') {
        Some(i) if valid_host(&rest[..i]) => Some(&rest[i + 1..]),
        None if valid_host(rest) => Some(""),
        _ => None,
    }
}

/// `%XX` of an unreserved character decoded (RFC 3986 §6.2.2.2: the same URI); any
/// other `%XX` kept, upper-cased, so it names nothing; `None` for a `%` not followed
/// by two hex digits.
fn decode_unreserved(path: &str) -> Option<String> {
    let mut parts = path.split('%');
    let mut out = String::with_capacity(path.len());
    out.push_str(parts.next().unwrap_or_default());
    for part in parts {
        let hex = part.get(..2).filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))?;
        let c = u8::from_str_radix(hex, 16).ok()?;
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(c));
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
        out.push_str(&part[2..]);
    }
    Some(out)
}

/// The query parameters the server reads.
const NUMERIC_PARAMS: [&str; 3] = ["rate", "lead", "stream"];

/// The value of parameter `key` in a query (`k=v&…`), the first if several.
pub fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?.split('&').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// Whether the parameters the server reads are each said at most once, as a decimal
/// `u64` (`rate` above 0).
fn valid_params(query: &str) -> bool {
    NUMERIC_PARAMS.iter().all(|key| {
        let mut values = query.split('&').filter_map(|kv| kv.strip_prefix(key)?.strip_prefix('='));
        match (values.next(), values.next()) {
            (None, _) => true,
            (Some(v), None) => {
                let ok = !v.is_empty() && v.len() <= 20 && v.bytes().all(|b| b.is_ascii_digit());
                ok && v.parse::<u64>().is_ok_and(|n| n > 0 || *key != "rate")
            }
            (Some(_), Some(_)) => false,
        }
    })
}

/// Whether `buf` (a head past [`MAX_HEAD`]) is still in its request line: a method,
/// a space, and no line end yet — the target is too long (414).
fn request_line_unended(buf: &[u8]) -> bool {
    let start = buf.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(buf.len());
    let line = &buf[start..];
    let method = line.iter().position(|&b| b == b' ').filter(|&i| i > 0);
    method.is_some_and(|m| line[..m].iter().all(u8::is_ascii_alphabetic)) && !line.contains(&b'\n')
}

/// Whether the request line is `METHOD TARGET HTTP/…` with digits and dots (another
/// version: 505), rather than something that is not a request line at all (400).
fn names_a_version(buf: &[u8]) -> bool {
    let start = buf.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(buf.len());
    let end = buf[start..].iter().position(|&b| b == b'\r' || b == b'\n').map_or(buf.len(), |e| start + e);
    let line = &buf[start..end];
    let parts: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let [_, _, token] = parts[..] else { return false };
    token.strip_prefix(b"HTTP/").is_some_and(|v| !v.is_empty() && v.iter().all(|b| b.is_ascii_digit() || *b == b'.'))
}

/// Where the minor digit of an `HTTP/1.x` version with x > 1 is in the request line,
/// if that is what it ends with (the line end may not have arrived yet).
fn later_minor(buf: &[u8]) -> Option<usize> {
    let start = buf.iter().position(|&b| b != b'\r' && b != b'\n')?;
    let end = buf[start..].iter().position(|&b| b == b'\r' || b == b'\n').map_or(buf.len(), |e| start + e);
    let line = &buf[start..end];
    let at = line.len().checked_sub(1)?;
    (line.len() > 8 && line[..at].ends_with(b" HTTP/1.") && (b'2'..=b'9').contains(&line[at])).then_some(start + at)
}

/// What the server knows of a name: a stream's length, validator and type, or a
/// generated document (a playlist).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource {
    /// A stream on the volume.
    Stream {
        /// Bytes.
        len: u64,
        /// Strong entity tag, quoted.
        etag: String,
    },
    /// A document made by the server (an HLS playlist), served from memory.
    Document {
        /// Its bytes.
        body: Vec<u8>,
        /// Strong entity tag, quoted.
        etag: String,
    },
}

/// Looks names up.
pub trait Catalog {
    /// The resource called `name` (already checked with [`valid_name`]).
    fn lookup(&self, name: &str) -> Option<Resource>;
}

/// A response to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Status code.
    pub status: u16,
    /// Status line and headers, ending with the empty line.
    pub head: Vec<u8>,
    /// The body, in order (empty for HEAD and errors without a body).
    pub body: Vec<Segment>,
    /// The stream the `Data` segments refer to, if any.
    pub stream: Option<String>,
    /// Whether to keep the connection open afterwards.
    pub keep_alive: bool,
}

impl Plan {
    /// Bytes of body on the wire.
    pub fn body_len(&self) -> u64 {
        self.body.iter().map(Segment::wire_len).sum()
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        304 => "Not Modified",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        414 => "URI Too Long",
        416 => "Range Not Satisfiable",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

/// The media type for a stream's name, from its extension.
pub fn content_type(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map_or("", |(_, e)| e);
    match ext.to_ascii_lowercase().as_str() {
        "ts" => "video/mp2t",
        "m3u8" => "application/vnd.apple.mpegurl",
        "mp4" | "m4v" => "video/mp4",
        "m4s" => "video/iso.segment",
        "mpd" => "application/dash+xml",
        "webm" => "video/webm",
        "mkv" => "video/x-matroska",
        "mp3" => "audio/mpeg",
        "aac" => "audio/aac",
        "txt" => "text/plain",
        _ => "application/octet-stream",
    }
}

/// A response with no body but a short text one for errors; `close` ends the connection.
pub fn error(status: u16, close: bool) -> Plan {
    let body = format!("{status} {}\n", reason(status));
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nServer: ictus-mars\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n",
        reason(status),
        body.len()
    );
    if status == 405 {
        head.push_str("Allow: GET, HEAD\r\n");
    }
    head.push_str(if close { "Connection: close\r\n\r\n" } else { "\r\n" });
    Plan {
        status,
        head: head.into_bytes(),
        body: vec![Segment::Bytes(body.into_bytes())],
        stream: None,
        keep_alive: !close,
    }
}

/// The answer to a request head [`parse`] refused with `status`, then close: a
/// [`error`], without its body if the request line says `HEAD` (a HEAD's answer has
/// no content, even a refusal's: RFC 9110 §9.3.2).
pub fn refusal(buf: &[u8], status: u16) -> Plan {
    let mut plan = error(status, true);
    let start = buf.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(buf.len());
    if buf[start..].starts_with(b"HEAD ") {
        plan.body.clear();
    }
    plan
}

/// Whether an `If-None-Match` list matches `etag` (weak comparison, RFC 9110 §13.1.2).
fn none_match(list: &str, etag: &str) -> bool {
    let bare = |t: &str| t.trim().trim_start_matches("W/").to_string();
    list.split(',').any(|t| t.trim() == "*" || bare(t) == bare(etag))
}

/// Plans the response to `req`; `boundary` separates multipart parts (the shell makes
/// it random, so it is unlikely to occur in the data).
pub fn respond(req: &RequestHead, catalog: &impl Catalog, boundary: &str) -> Plan {
    let close = !req.keep_alive;
    // A HEAD's answer has the head a GET's would, and no content (RFC 9110 §9.3.2).
    let not_found = || {
        let mut plan = error(404, close);
        if req.method == Method::Head {
            plan.body.clear();
        }
        plan
    };
    if !valid_name(&req.path) {
        return not_found();
    }
    let Some(resource) = catalog.lookup(&req.path) else { return not_found() };
    let (len, etag, document) = match resource {
        Resource::Stream { len, etag } => (len, etag, None),
        Resource::Document { body, etag } => (body.len() as u64, etag, Some(body)),
    };
    let ctype = content_type(&req.path);
    let connection = if close { "Connection: close\r\n" } else { "" };
    let common = format!("Server: ictus-mars\r\nAccept-Ranges: bytes\r\nETag: {etag}\r\n{connection}");
    if req.if_none_match.as_deref().is_some_and(|l| none_match(l, &etag)) {
        let head = format!("HTTP/1.1 304 Not Modified\r\n{common}\r\n");
        return Plan { status: 304, head: head.into_bytes(), body: Vec::new(), stream: None, keep_alive: !close };
    }
    // If-Range: ranges only if the validator is our (strong) entity tag; a date or
    // another tag means "send it all".
    let ranges_apply = req.if_range.as_deref().map_or(true, |v| !v.starts_with("W/") && v == etag);
    let ranges = if ranges_apply { range::resolve(req.range.as_deref(), len) } else { Ranges::Whole };
    let data = |offset: u64, n: u64| match &document {
        Some(d) => Segment::Bytes(d[offset as usize..(offset + n) as usize].to_vec()),
        None => Segment::Data { offset, len: n },
    };
    let (status, head_extra, body) = match ranges {
        Ranges::Unsatisfiable => {
            let head = format!(
                "HTTP/1.1 416 Range Not Satisfiable\r\n{common}Content-Range: bytes */{len}\r\nContent-Length: 0\r\n\r\n"
            );
            return Plan { status: 416, head: head.into_bytes(), body: Vec::new(), stream: None, keep_alive: !close };
        }
        Ranges::Whole => (200, format!("Content-Type: {ctype}\r\n"), vec![data(0, len)]),
        Ranges::Partial(r) if r.len() == 1 => {
            let ByteRange { start, len: n } = r[0];
            (
                206,
                format!("Content-Type: {ctype}\r\nContent-Range: bytes {start}-{}/{len}\r\n", r[0].last()),
                vec![data(start, n)],
            )
        }
        Ranges::Partial(r) => {
            let parts = range::multipart(&r, len, ctype, boundary)
                .into_iter()
                .map(|s| match s {
                    Segment::Data { offset, len } => data(offset, len),
                    b => b,
                })
                .collect();
            (206, format!("Content-Type: multipart/byteranges; boundary={boundary}\r\n"), parts)
        }
    };
    let body_len: u64 = body.iter().map(Segment::wire_len).sum();
    let head =
        format!("HTTP/1.1 {status} {}\r\n{common}{head_extra}Content-Length: {body_len}\r\n\r\n", reason(status));
    let body =
        if req.method == Method::Head { Vec::new() } else { body.into_iter().filter(|s| s.wire_len() > 0).collect() };
    Plan {
        status,
        head: head.into_bytes(),
        body,
        stream: document.is_none().then(|| req.path.clone()),
        keep_alive: !close,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct One;
    impl Catalog for One {
        fn lookup(&self, name: &str) -> Option<Resource> {
            match name {
                "a.ts" => Some(Resource::Stream { len: 1000, etag: "\"v1\"".into() }),
                "a.m3u8" => Some(Resource::Document { body: b"#EXTM3U\n".to_vec(), etag: "\"p\"".into() }),
                _ => None,
            }
        }
    }

    fn req(text: &str) -> RequestHead {
        match parse(text.as_bytes()) {
            Parsed::Request(r, n) => {
                assert_eq!(n, text.len());
                r
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn heads_parse_and_refuse() {
        let r = req("GET /a.ts?x=1 HTTP/1.1\r\nHost: h\r\nRange: bytes=0-1\r\n\r\n");
        assert_eq!((r.method, r.path.as_str(), r.keep_alive), (Method::Get, "a.ts", true));
        assert_eq!(r.range.as_deref(), Some("bytes=0-1"));
        assert!(!req("GET /a HTTP/1.0\r\n\r\n").keep_alive);
        assert!(req("GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
        assert!(!req("HEAD /a HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").keep_alive);
        assert_eq!(parse(b"GET /a HTTP/1.1\r\nHost: h\r\n"), Parsed::Partial);
        assert_eq!(parse(b"GET /a HTTP/1.1\r\n\r\n"), Parsed::Refuse(400), "no Host");
        assert_eq!(parse(b"POST /a HTTP/1.1\r\nHost: h\r\n\r\n"), Parsed::Refuse(405));
        assert_eq!(parse(b"GET /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n"), Parsed::Refuse(400));
        assert_eq!(parse(b"GET /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"), Parsed::Refuse(400));
        assert_eq!(parse(b"GET /a HTTP/2.0\r\nHost: h\r\n\r\n"), Parsed::Refuse(505));
        // Absolute form: a server MUST accept it (RFC 9112 §3.2.2); it used to be 400.
        assert_eq!(req("GET http://x/a HTTP/1.1\r\nHost: h\r\n\r\n").path, "a");
        assert_eq!(parse(b"\x00\x01garbage\r\n\r\n"), Parsed::Refuse(400));
        assert_eq!(parse(&vec![b'a'; MAX_HEAD]), Parsed::Refuse(431), "a head that never ends");
        let long = format!("GET /a HTTP/1.1\r\nHost: h\r\nX: {}", "y".repeat(MAX_HEAD));
        assert_eq!(parse(long.as_bytes()), Parsed::Refuse(431));
        let many = format!("GET /a HTTP/1.1\r\nHost: h\r\n{}\r\n", "X: y\r\n".repeat(MAX_HEADERS));
        assert_eq!(parse(many.as_bytes()), Parsed::Refuse(431));
    }

    /// What a hostile client sends, each with the status RFC 9110/9112 give it.
    #[test]
    fn hostile_heads_get_the_status_the_rfcs_give() {
        let refuse = |t: &str| match parse(t.as_bytes()) {
            Parsed::Refuse(s) => s,
            other => panic!("{t:?}: {other:?}"),
        };
        // Absolute form is served (RFC 9112 §3.2.2: a server MUST accept it).
        assert_eq!(req("GET http://h:8080/a.ts?rate=5 HTTP/1.1\r\nHost: h\r\n\r\n").path, "a.ts");
        assert_eq!(req("GET HTTPS://h/d/a.ts HTTP/1.1\r\nHost: h\r\n\r\n").path, "d/a.ts");
        assert_eq!(req("GET http://h HTTP/1.1\r\nHost: h\r\n\r\n").path, "");
        assert_eq!(refuse("GET ftp://h/a.ts HTTP/1.1\r\nHost: h\r\n\r\n"), 400);
        assert_eq!(refuse("GET http://a b/a.ts HTTP/1.1\r\nHost: h\r\n\r\n"), 400);
        assert_eq!(refuse("GET * HTTP/1.1\r\nHost: h\r\n\r\n"), 400);
        assert_eq!(refuse("GET /a.ts#x HTTP/1.1\r\nHost: h\r\n\r\n"), 400);
        // Percent-encoded unreserved characters are those characters; nothing else is
        // decoded, so no encoding names past what a plain path can.
        assert_eq!(req("GET /a%2Ets HTTP/1.1\r\nHost: h\r\n\r\n").path, "a.ts");
        assert_eq!(req("GET /%61%2e%74%73 HTTP/1.1\r\nHost: h\r\n\r\n").path, "a.ts");
        for escape in ["/%2e%2e/etc/passwd", "/d%2Fa.ts", "/a.ts%00", "/%2E%2E%2Fa.ts", "/a%20b"] {
            let r = req(&format!("GET {escape} HTTP/1.1\r\nHost: h\r\n\r\n"));
            assert!(!valid_name(&r.path), "{escape} -> {}", r.path);
            assert_eq!(respond(&r, &One, "B").status, 404, "{escape}");
        }
        for bad in ["/a%", "/a%2", "/a%zz", "/a%2G"] {
            assert_eq!(refuse(&format!("GET {bad} HTTP/1.1\r\nHost: h\r\n\r\n")), 400, "{bad}");
        }
        // Later HTTP/1 minors are served as 1.1 (RFC 9110 §2.5); other majors are 505.
        assert_eq!(req("GET /a.ts HTTP/1.2\r\nHost: h\r\n\r\n").minor, 1);
        assert_eq!(req("\r\nGET /a.ts HTTP/1.9\r\nHost: h\r\n\r\n").minor, 1);
        assert_eq!(parse(b"GET /a.ts HTTP/1.2"), Parsed::Partial);
        assert_eq!(refuse("GET /a.ts HTTP/1.2\r\n\r\n"), 400, "served as 1.1, so Host is needed");
        assert_eq!(refuse("GET /a.ts HTTP/3.0\r\nHost: h\r\n\r\n"), 505);
        assert_eq!(refuse("GET /a.ts HTTP/1.23\r\nHost: h\r\n\r\n"), 505);
        assert_eq!(refuse("GET /a.ts XTTP/1.1\r\nHost: h\r\n\r\n"), 400, "not a version: a bad line");
        // Host: one, of valid characters (empty is valid).
        assert_eq!(refuse("GET /a.ts HTTP/1.1\r\nHost: a b\r\n\r\n"), 400);
        assert_eq!(refuse("GET /a.ts HTTP/1.1\r\nHost: a/b\r\n\r\n"), 400);
        assert_eq!(req("GET /a.ts HTTP/1.1\r\nHost:\r\n\r\n").path, "a.ts");
        assert_eq!(req("GET /a.ts HTTP/1.1\r\nHost: [::1]:80\r\n\r\n").path, "a.ts");
        // A Content-Length that says no body, in any spelling, is no body.
        assert!(req("GET /a.ts HTTP/1.1\r\nHost: h\r\nContent-Length: 00\r\n\r\n").keep_alive);
        assert!(req("GET /a.ts HTTP/1.1\r\nHost: h\r\nContent-Length: 0, 0\r\n\r\n").keep_alive);
        for cl in ["1", "-0", "0x0", "", "0, 1", "+0"] {
            assert_eq!(refuse(&format!("GET /a.ts HTTP/1.1\r\nHost: h\r\nContent-Length: {cl}\r\n\r\n")), 400);
        }
        // A request line past MAX_HEAD is 414; a head past it 431.
        let long = format!("GET /{} HTTP/1.1\r\nHost: h\r\n\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(refuse(&long), 414);
        assert_eq!(refuse(&long[..MAX_HEAD]), 414, "the line end need not have arrived");
        // Repeated Range / If-Range lines make one invalid list: the whole is sent.
        let two = |h: &str| respond(&req(&format!("GET /a.ts HTTP/1.1\r\nHost: h\r\n{h}\r\n")), &One, "B");
        assert_eq!(two("Range: bytes=0-1\r\nRange: bytes=5-6\r\n").status, 200);
        assert_eq!(two("Range: bytes=0-1\r\nIf-Range: \"v1\"\r\nIf-Range: \"v1\"\r\n").status, 200);
        assert_eq!(two("If-None-Match: \"x\"\r\nIf-None-Match: \"v1\"\r\n").status, 304);
        // The parameters the server reads: decimal, once; rate above 0.
        for q in
            ["rate=abc", "rate=0", "rate=-5", "rate=1e9", "rate=", "rate=NaN", "rate=5&rate=6", "lead=x", "stream=1.5"]
        {
            assert_eq!(refuse(&format!("GET /a.ts?{q} HTTP/1.1\r\nHost: h\r\n\r\n")), 400, "{q}");
        }
        let r = req("GET /a.ts?rate=500000&lead=0&stream=7&t=anything HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!(query_param(r.query.as_deref(), "rate"), Some("500000"));
        assert_eq!(query_param(r.query.as_deref(), "x"), None);
    }

    #[test]
    fn a_refused_head_has_no_body() {
        let h = b"HEAD /a.ts?rate=0 HTTP/1.1\r\nHost: h\r\n\r\n";
        assert_eq!(parse(h), Parsed::Refuse(400));
        let p = refusal(h, 400);
        assert!(p.body.is_empty() && !p.keep_alive);
        assert!(String::from_utf8_lossy(&p.head).contains("Content-Length: 16\r\n"), "a GET's length");
        assert_eq!(refusal(b"GET /a.ts?rate=0 HTTP/1.1\r\n\r\n", 400).body_len(), 16);
    }

    #[test]
    fn responses() {
        let get = |extra: &str| respond(&req(&format!("GET /a.ts HTTP/1.1\r\nHost: h\r\n{extra}\r\n")), &One, "B");
        let p = get("");
        assert_eq!((p.status, p.body.clone()), (200, vec![Segment::Data { offset: 0, len: 1000 }]));
        assert!(String::from_utf8_lossy(&p.head).contains("Content-Length: 1000\r\n"));
        let p = get("Range: bytes=10-19\r\n");
        assert_eq!(p.status, 206);
        assert!(String::from_utf8_lossy(&p.head).contains("Content-Range: bytes 10-19/1000\r\n"));
        let p = get("Range: bytes=0-0,-1\r\n");
        assert_eq!(p.status, 206);
        assert_eq!(p.body_len(), p.body.iter().map(Segment::wire_len).sum::<u64>());
        assert!(String::from_utf8_lossy(&p.head).contains(&format!("Content-Length: {}\r\n", p.body_len())));
        assert_eq!(get("Range: bytes=2000-\r\n").status, 416);
        assert_eq!(get("Range: bytes=0-1\r\nIf-Range: \"v1\"\r\n").status, 206);
        assert_eq!(get("Range: bytes=0-1\r\nIf-Range: \"v0\"\r\n").status, 200);
        assert_eq!(get("Range: bytes=0-1\r\nIf-Range: W/\"v1\"\r\n").status, 200);
        assert_eq!(get("Range: bytes=0-1\r\nIf-Range: Tue, 15 Nov 1994 08:12:31 GMT\r\n").status, 200);
        assert_eq!(get("If-None-Match: W/\"v1\"\r\n").status, 304);
        let h = respond(&req("HEAD /a.ts HTTP/1.1\r\nHost: h\r\n\r\n"), &One, "B");
        assert!(h.body.is_empty() && String::from_utf8_lossy(&h.head).contains("Content-Length: 1000\r\n"));
        assert_eq!(respond(&req("GET /nope HTTP/1.1\r\nHost: h\r\n\r\n"), &One, "B").status, 404);
        assert_eq!(respond(&req("GET /../etc/passwd HTTP/1.1\r\nHost: h\r\n\r\n"), &One, "B").status, 404);
        let d = respond(&req("GET /a.m3u8 HTTP/1.1\r\nHost: h\r\nRange: bytes=1-2\r\n\r\n"), &One, "B");
        assert_eq!((d.status, d.body.clone(), d.stream.clone()), (206, vec![Segment::Bytes(b"EX".to_vec())], None));
    }
}
