//! HTTP/1.1 requests from players, as a pure function: untrusted bytes in, a response
//! plan out (status line and headers, then body segments that name ranges of a stream).
//! The server shell moves the bytes; everything that decides what to send is here, so
//! the fuzz target and the unit tests cover it without sockets.
//!
//! Parsing is `httparse`'s (a request head of at most [`MAX_HEAD`] bytes and
//! [`MAX_HEADERS`] fields); what it accepts is then checked: method `GET` or `HEAD`
//! (405 otherwise), `Host` present in HTTP/1.1 (400), no request body (400: a player never
//! sends one, and refusing it means no body framing to get wrong), a path that is a
//! valid stream name ([`crate::label::valid_name`]; 404 otherwise, since no encoding can
//! name a stream that the plain form cannot).

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
            return if buf.len() >= MAX_HEAD { Parsed::Refuse(431) } else { Parsed::Partial };
        }
        Err(httparse::Error::TooManyHeaders) => return Parsed::Refuse(431),
        Err(httparse::Error::Version) => return Parsed::Refuse(505),
        Err(_) => return Parsed::Refuse(400),
    };
    if len > MAX_HEAD {
        return Parsed::Refuse(431);
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
            if host {
                return Parsed::Refuse(400);
            }
            host = true;
        } else if name.eq_ignore_ascii_case("range") {
            range = Some(value.to_string());
        } else if name.eq_ignore_ascii_case("if-range") {
            if_range = Some(value.trim().to_string());
        } else if name.eq_ignore_ascii_case("if-none-match") {
            if_none_match = Some(value.to_string());
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                connection_close |= token.eq_ignore_ascii_case("close");
                connection_keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || (name.eq_ignore_ascii_case("content-length") && value.trim() != "0")
        {
            return Parsed::Refuse(400);
        }
    }
    if minor >= 1 && !host {
        return Parsed::Refuse(400);
    }
    let keep_alive = if minor >= 1 { !connection_close } else { connection_keep_alive && !connection_close };
    let (path, query) = match path.split_once('?') {
        Some((p, q)) => (p, Some(q.to_string())),
        None => (path, None),
    };
    let Some(path) = path.strip_prefix('/') else {
        // Absolute-form and asterisk-form targets are for proxies and OPTIONS.
        return Parsed::Refuse(400);
    };
    Parsed::Request(
        RequestHead { method, path: path.to_string(), query, minor, range, if_range, if_none_match, keep_alive },
        len,
    )
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
        assert_eq!(parse(b"GET http://x/a HTTP/1.1\r\nHost: h\r\n\r\n"), Parsed::Refuse(400));
        assert_eq!(parse(b"\x00\x01garbage\r\n\r\n"), Parsed::Refuse(400));
        assert_eq!(parse(&vec![b'a'; MAX_HEAD]), Parsed::Refuse(431), "a head that never ends");
        let long = format!("GET /a HTTP/1.1\r\nHost: h\r\nX: {}", "y".repeat(MAX_HEAD));
        assert_eq!(parse(long.as_bytes()), Parsed::Refuse(431));
        let many = format!("GET /a HTTP/1.1\r\nHost: h\r\n{}\r\n", "X: y\r\n".repeat(MAX_HEADERS));
        assert_eq!(parse(many.as_bytes()), Parsed::Refuse(431));
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
