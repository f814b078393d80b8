//! The wire format: requests (client → server) and messages (server → client). Pure:
//! no system calls, no shared memory; bytes in, a checked [`Request`] or a
//! [`DecodeError`] out.
//!
//! Every request and message is a multiple of 4 bytes, little-endian, and starts with an
//! 8-byte header:
//!
//! ```text
//! request:  op: u8 | flags: u8 | zero: u16 | len: u32     (len counts the header)
//! message:  kind: u8 | flags: u8 | zero: u16 | len: u32
//! ```
//!
//! The same bytes travel over every transport: a stream socket carries them back to
//! back; a port message carries a batch in-line and large images out-of-line; a
//! shared-memory ring carries a batch per record and large images in pool buffers.
//! An image not in-line is an *attachment*, named by its sequence number among the
//! client's attachments (the out-of-line regions of its port messages, or its pool
//! records, in the order they were sent).
//!
//! Pixels are 32 bits, `0x00RRGGBB` as a little-endian `u32` (X11's ZPixmap at depth 24),
//! rows `stride` bytes apart.

use std::fmt;

/// Length of a request or message header.
pub const HEADER: usize = 8;
/// The longest request (an in-line 1920×1080 frame is 8 MiB).
pub const MAX_REQUEST: usize = 64 << 20;
/// The widest or tallest window or image.
pub const MAX_SIDE: u16 = 8192;
/// Version of the protocol; the server refuses others at connect time.
pub const VERSION: u32 = 1;

/// Request opcodes.
pub mod op {
    /// Create a window.
    pub const CREATE_WINDOW: u8 = 1;
    /// Destroy a window.
    pub const DESTROY_WINDOW: u8 = 2;
    /// Move or resize a window.
    pub const CONFIGURE_WINDOW: u8 = 3;
    /// Set a window's title.
    pub const SET_TITLE: u8 = 4;
    /// Fill rectangles (copy or xor).
    pub const FILL_RECTS: u8 = 10;
    /// Draw line segments (copy or xor).
    pub const SEGMENTS: u8 = 11;
    /// Draw text.
    pub const TEXT: u8 = 12;
    /// Copy an area of a window within it (scrolling).
    pub const COPY_AREA: u8 = 13;
    /// Draw an image into a window.
    pub const PUT_IMAGE: u8 = 14;
    /// Show a frame at a time.
    pub const PRESENT_FRAME: u8 = 15;
    /// Answer when everything before has been done.
    pub const SYNC: u8 = 20;
}

/// Message kinds.
pub mod kind {
    /// The answer to a sync.
    pub const SYNCED: u8 = 1;
    /// A request failed.
    pub const ERROR: u8 = 2;
    /// Part of a window was exposed.
    pub const EXPOSE: u8 = 3;
    /// A window was moved or resized.
    pub const CONFIGURE: u8 = 4;
    /// A key went down or up.
    pub const KEY: u8 = 5;
    /// A pointer button went down or up.
    pub const BUTTON: u8 = 6;
    /// The pointer moved.
    pub const MOTION: u8 = 7;
    /// A frame was shown (or dropped).
    pub const FRAME: u8 = 8;
}

const F_XOR: u8 = 1;
const F_BG: u8 = 2;
const F_ATTACHED: u8 = 4;
const F_SHOWN: u8 = 8;
const F_DROPPED: u8 = 1;

/// How a drawing combines with what is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RasterOp {
    /// Replace (X11's `GXcopy`).
    Copy,
    /// Exclusive-or (X11's `GXxor`): drawing twice restores.
    Xor,
}

/// A rectangle: position and size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rect {
    /// Left.
    pub x: i16,
    /// Top.
    pub y: i16,
    /// Width.
    pub w: u16,
    /// Height.
    pub h: u16,
}

impl Rect {
    /// A rectangle.
    pub const fn new(x: i16, y: i16, w: u16, h: u16) -> Rect {
        Rect { x, y, w, h }
    }
}

/// A line segment from `(x1, y1)` to `(x2, y2)`, both ends drawn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Start x.
    pub x1: i16,
    /// Start y.
    pub y1: i16,
    /// End x.
    pub x2: i16,
    /// End y.
    pub y2: i16,
}

/// Where an image's pixels are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source<'a> {
    /// In the request, `height` rows of `stride` bytes.
    Inline(&'a [u8]),
    /// The client's attachment with this sequence number.
    Attachment(u32),
}

/// A list of 8-byte items in a request, checked for length, read on demand.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Items<'a, T> {
    bytes: &'a [u8],
    _t: std::marker::PhantomData<T>,
}

impl<T> fmt::Debug for Items<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} items", self.bytes.len() / 8)
    }
}

impl<'a, T: Item> Items<'a, T> {
    /// Number of items.
    pub fn len(&self) -> usize {
        self.bytes.len() / 8
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The items.
    pub fn iter(&self) -> impl Iterator<Item = T> + 'a {
        self.bytes.chunks_exact(8).map(|c| T::read(c.try_into().expect("8 bytes")))
    }
}

/// Something stored in 8 bytes.
pub trait Item: Sized {
    /// Reads one.
    fn read(b: &[u8; 8]) -> Self;
    /// Writes one.
    fn write(&self, out: &mut Vec<u8>);
}

impl Item for Rect {
    fn read(b: &[u8; 8]) -> Rect {
        Rect {
            x: i16::from_le_bytes([b[0], b[1]]),
            y: i16::from_le_bytes([b[2], b[3]]),
            w: u16::from_le_bytes([b[4], b[5]]),
            h: u16::from_le_bytes([b[6], b[7]]),
        }
    }
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.x.to_le_bytes());
        out.extend_from_slice(&self.y.to_le_bytes());
        out.extend_from_slice(&self.w.to_le_bytes());
        out.extend_from_slice(&self.h.to_le_bytes());
    }
}

impl Item for Segment {
    fn read(b: &[u8; 8]) -> Segment {
        Segment {
            x1: i16::from_le_bytes([b[0], b[1]]),
            y1: i16::from_le_bytes([b[2], b[3]]),
            x2: i16::from_le_bytes([b[4], b[5]]),
            y2: i16::from_le_bytes([b[6], b[7]]),
        }
    }
    fn write(&self, out: &mut Vec<u8>) {
        for v in [self.x1, self.y1, self.x2, self.y2] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// A request, decoded and checked (sizes in range, lengths consistent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// Create window `id` (the client's own number, not 0), top-level or inside
    /// `parent`, filled with `background`.
    CreateWindow {
        /// The client's number for it.
        id: u32,
        /// The client's parent window, or 0 for a top-level window.
        parent: u32,
        /// Position and size.
        rect: Rect,
        /// Initial colour.
        background: u32,
    },
    /// Destroy window `id` and its sub-windows.
    DestroyWindow {
        /// Which.
        id: u32,
    },
    /// Move and resize window `id`.
    ConfigureWindow {
        /// Which.
        id: u32,
        /// New position and size.
        rect: Rect,
    },
    /// Set window `id`'s title.
    SetTitle {
        /// Which.
        id: u32,
        /// The title's bytes (UTF-8 is expected, not trusted).
        title: &'a [u8],
    },
    /// Fill rectangles.
    FillRects {
        /// Where.
        window: u32,
        /// How.
        op: RasterOp,
        /// Colour.
        color: u32,
        /// What.
        rects: Items<'a, Rect>,
    },
    /// Draw line segments.
    Segments {
        /// Where.
        window: u32,
        /// How.
        op: RasterOp,
        /// Colour.
        color: u32,
        /// What.
        segments: Items<'a, Segment>,
    },
    /// Draw text with the server's 8×8 font, the cell's top-left at `(x, y)`.
    Text {
        /// Where.
        window: u32,
        /// Left of the first cell.
        x: i16,
        /// Top of the cells.
        y: i16,
        /// Glyph colour.
        fg: u32,
        /// Cell background (X11's ImageText), or none (PolyText).
        bg: Option<u32>,
        /// Bytes, one cell each (Latin-1 below 128 drawn, others as a box).
        text: &'a [u8],
    },
    /// Copy `src` to `(dx, dy)` within the window (overlaps allowed: scrolling).
    CopyArea {
        /// Where.
        window: u32,
        /// From.
        src: Rect,
        /// To x.
        dx: i16,
        /// To y.
        dy: i16,
    },
    /// Draw an image into the window's contents.
    PutImage {
        /// Where.
        window: u32,
        /// Position and size of the image.
        rect: Rect,
        /// Bytes between rows (at least `4 * w`, a multiple of 4).
        stride: u32,
        /// The pixels.
        source: Source<'a>,
    },
    /// Show a frame at `due_ns` (`CLOCK_MONOTONIC`; 0: now), zero-copy where the
    /// transport allows; answered by a frame message carrying `tag`.
    PresentFrame {
        /// Where.
        window: u32,
        /// Position and size of the frame.
        rect: Rect,
        /// Bytes between rows.
        stride: u32,
        /// The pixels.
        source: Source<'a>,
        /// The client's tag, returned in the frame message.
        tag: u32,
        /// When to show it.
        due_ns: u64,
    },
    /// Answer [`Message::Synced`] once every request before is done, and with `shown`
    /// once what they drew has also reached the screen (the X server).
    Sync {
        /// The client's number, returned.
        serial: u32,
        /// Wait for the screen too.
        shown: bool,
    },
}

/// Why bytes are not a valid request or message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than a header, or than the header's length.
    #[error("truncated: {have} of {need} bytes")]
    Truncated {
        /// Bytes there.
        have: usize,
        /// Bytes needed.
        need: usize,
    },
    /// The length is not a multiple of 4, is shorter than the request's fixed part, or
    /// exceeds the limit.
    #[error("bad length {len} for opcode {op}")]
    BadLength {
        /// The opcode.
        op: u8,
        /// The length.
        len: usize,
    },
    /// No such opcode or message kind.
    #[error("unknown opcode {0}")]
    UnknownOp(u8),
    /// Flags or reserved bits that this opcode does not define.
    #[error("reserved bits set in opcode {0}")]
    Reserved(u8),
    /// A size or stride out of range, or inconsistent with the data.
    #[error("bad geometry in opcode {0}")]
    BadGeometry(u8),
}

/// Little-endian reads at fixed offsets of a slice already checked to be long enough.
struct Rd<'a>(&'a [u8]);

impl<'a> Rd<'a> {
    fn u16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.0[at], self.0[at + 1]])
    }
    fn i16(&self, at: usize) -> i16 {
        self.u16(at) as i16
    }
    fn u32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.0[at..at + 4].try_into().expect("4 bytes"))
    }
    fn u64(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.0[at..at + 8].try_into().expect("8 bytes"))
    }
    fn rect(&self, at: usize) -> Rect {
        Rect::read(self.0[at..at + 8].try_into().expect("8 bytes"))
    }
}

fn header(buf: &[u8], max: usize) -> Result<(u8, u8, usize), DecodeError> {
    if buf.len() < HEADER {
        return Err(DecodeError::Truncated { have: buf.len(), need: HEADER });
    }
    let r = Rd(buf);
    let (op, flags) = (buf[0], buf[1]);
    let len = r.u32(4) as usize;
    if r.u16(2) != 0 {
        return Err(DecodeError::Reserved(op));
    }
    if len < HEADER || len % 4 != 0 || len > max {
        return Err(DecodeError::BadLength { op, len });
    }
    if buf.len() < len {
        return Err(DecodeError::Truncated { have: buf.len(), need: len });
    }
    Ok((op, flags, len))
}

/// The length of the request or message that starts `buf`, once its header is there
/// (for a stream reader: how many bytes to wait for), or why it can never be valid.
pub fn peek_len(buf: &[u8]) -> Result<Option<usize>, DecodeError> {
    match header(buf, MAX_REQUEST) {
        Ok((_, _, len)) => Ok(Some(len)),
        Err(DecodeError::Truncated { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

fn check_image(op: u8, rect: Rect, stride: u32) -> Result<usize, DecodeError> {
    let bad = DecodeError::BadGeometry(op);
    if rect.w == 0 || rect.h == 0 || rect.w > MAX_SIDE || rect.h > MAX_SIDE {
        return Err(bad);
    }
    if stride % 4 != 0 || (stride as usize) < rect.w as usize * 4 || stride as usize > MAX_SIDE as usize * 8 {
        return Err(bad);
    }
    // The last row needs only its pixels, not a whole stride.
    Ok(stride as usize * (rect.h as usize - 1) + rect.w as usize * 4)
}

impl<'a> Request<'a> {
    /// Decode the request at the start of `buf`; returns it and its length in bytes.
    pub fn decode(buf: &'a [u8]) -> Result<(Request<'a>, usize), DecodeError> {
        let (op, flags, len) = header(buf, MAX_REQUEST)?;
        let body = &buf[..len];
        let r = Rd(body);
        let fixed = |n: usize| if len < n { Err(DecodeError::BadLength { op, len }) } else { Ok(()) };
        let exact = |n: usize| if len != n { Err(DecodeError::BadLength { op, len }) } else { Ok(()) };
        let only = |allowed: u8| if flags & !allowed != 0 { Err(DecodeError::Reserved(op)) } else { Ok(()) };
        let rop = if flags & F_XOR != 0 { RasterOp::Xor } else { RasterOp::Copy };
        // Variable tails: `n` bytes at `at`, padded to 4 to the end of the request.
        let tail = |at: usize, n: usize| -> Result<&'a [u8], DecodeError> {
            if at + n.next_multiple_of(4) != len {
                return Err(DecodeError::BadLength { op, len });
            }
            Ok(&body[at..at + n])
        };
        let req = match op {
            op::CREATE_WINDOW => {
                exact(28)?;
                only(0)?;
                let rect = r.rect(16);
                if rect.w == 0 || rect.h == 0 || rect.w > MAX_SIDE || rect.h > MAX_SIDE || r.u32(8) == 0 {
                    return Err(DecodeError::BadGeometry(op));
                }
                Request::CreateWindow { id: r.u32(8), parent: r.u32(12), rect, background: r.u32(24) }
            }
            op::DESTROY_WINDOW => {
                exact(12)?;
                only(0)?;
                Request::DestroyWindow { id: r.u32(8) }
            }
            op::CONFIGURE_WINDOW => {
                exact(20)?;
                only(0)?;
                let rect = r.rect(12);
                if rect.w == 0 || rect.h == 0 || rect.w > MAX_SIDE || rect.h > MAX_SIDE {
                    return Err(DecodeError::BadGeometry(op));
                }
                Request::ConfigureWindow { id: r.u32(8), rect }
            }
            op::SET_TITLE => {
                fixed(16)?;
                only(0)?;
                let n = r.u32(12) as usize;
                Request::SetTitle { id: r.u32(8), title: tail(16, n)? }
            }
            op::FILL_RECTS | op::SEGMENTS => {
                fixed(16)?;
                only(F_XOR)?;
                let (window, color) = (r.u32(8), r.u32(12));
                let bytes = &body[16..];
                if bytes.len() % 8 != 0 {
                    return Err(DecodeError::BadLength { op, len });
                }
                if op == op::FILL_RECTS {
                    Request::FillRects { window, op: rop, color, rects: Items { bytes, _t: std::marker::PhantomData } }
                } else {
                    Request::Segments {
                        window,
                        op: rop,
                        color,
                        segments: Items { bytes, _t: std::marker::PhantomData },
                    }
                }
            }
            op::TEXT => {
                fixed(28)?;
                only(F_BG)?;
                let n = r.u32(24) as usize;
                let bg = (flags & F_BG != 0).then(|| r.u32(20));
                Request::Text { window: r.u32(8), x: r.i16(12), y: r.i16(14), fg: r.u32(16), bg, text: tail(28, n)? }
            }
            op::COPY_AREA => {
                exact(24)?;
                only(0)?;
                Request::CopyArea { window: r.u32(8), src: r.rect(12), dx: r.i16(20), dy: r.i16(22) }
            }
            op::PUT_IMAGE | op::PRESENT_FRAME => {
                let at = if op == op::PUT_IMAGE { 28 } else { 40 };
                fixed(at)?;
                only(F_ATTACHED)?;
                let (window, rect, stride) = (r.u32(8), r.rect(12), r.u32(20));
                let need = check_image(op, rect, stride)?;
                let source = if flags & F_ATTACHED != 0 {
                    exact(at)?;
                    Source::Attachment(r.u32(24))
                } else {
                    if r.u32(24) as usize != need {
                        return Err(DecodeError::BadGeometry(op));
                    }
                    Source::Inline(tail(at, need)?)
                };
                if op == op::PUT_IMAGE {
                    Request::PutImage { window, rect, stride, source }
                } else {
                    Request::PresentFrame { window, rect, stride, source, tag: r.u32(28), due_ns: r.u64(32) }
                }
            }
            op::SYNC => {
                exact(12)?;
                only(F_SHOWN)?;
                Request::Sync { serial: r.u32(8), shown: flags & F_SHOWN != 0 }
            }
            other => return Err(DecodeError::UnknownOp(other)),
        };
        Ok((req, len))
    }

    /// Bytes an image needs (in-line or in an attachment): `stride * (h - 1) + 4 * w`.
    pub fn image_len(rect: Rect, stride: u32) -> usize {
        stride as usize * (rect.h.max(1) as usize - 1) + rect.w as usize * 4
    }

    /// Append the encoded request to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        let mut flags = 0u8;
        let opcode;
        out.extend_from_slice(&[0; HEADER]);
        let put_rect = |out: &mut Vec<u8>, r: Rect| r.write(out);
        match *self {
            Request::CreateWindow { id, parent, rect, background } => {
                opcode = op::CREATE_WINDOW;
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&parent.to_le_bytes());
                put_rect(out, rect);
                out.extend_from_slice(&background.to_le_bytes());
            }
            Request::DestroyWindow { id } => {
                opcode = op::DESTROY_WINDOW;
                out.extend_from_slice(&id.to_le_bytes());
            }
            Request::ConfigureWindow { id, rect } => {
                opcode = op::CONFIGURE_WINDOW;
                out.extend_from_slice(&id.to_le_bytes());
                put_rect(out, rect);
            }
            Request::SetTitle { id, title } => {
                opcode = op::SET_TITLE;
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&(title.len() as u32).to_le_bytes());
                out.extend_from_slice(title);
            }
            Request::FillRects { window, op, color, rects } => {
                opcode = op::FILL_RECTS;
                flags |= if op == RasterOp::Xor { F_XOR } else { 0 };
                out.extend_from_slice(&window.to_le_bytes());
                out.extend_from_slice(&color.to_le_bytes());
                out.extend_from_slice(rects.bytes);
            }
            Request::Segments { window, op, color, segments } => {
                opcode = op::SEGMENTS;
                flags |= if op == RasterOp::Xor { F_XOR } else { 0 };
                out.extend_from_slice(&window.to_le_bytes());
                out.extend_from_slice(&color.to_le_bytes());
                out.extend_from_slice(segments.bytes);
            }
            Request::Text { window, x, y, fg, bg, text } => {
                opcode = op::TEXT;
                flags |= if bg.is_some() { F_BG } else { 0 };
                out.extend_from_slice(&window.to_le_bytes());
                out.extend_from_slice(&x.to_le_bytes());
                out.extend_from_slice(&y.to_le_bytes());
                out.extend_from_slice(&fg.to_le_bytes());
                out.extend_from_slice(&bg.unwrap_or(0).to_le_bytes());
                out.extend_from_slice(&(text.len() as u32).to_le_bytes());
                out.extend_from_slice(text);
            }
            Request::CopyArea { window, src, dx, dy } => {
                opcode = op::COPY_AREA;
                out.extend_from_slice(&window.to_le_bytes());
                put_rect(out, src);
                out.extend_from_slice(&dx.to_le_bytes());
                out.extend_from_slice(&dy.to_le_bytes());
            }
            Request::PutImage { window, rect, stride, source }
            | Request::PresentFrame { window, rect, stride, source, .. } => {
                opcode = if matches!(self, Request::PutImage { .. }) { op::PUT_IMAGE } else { op::PRESENT_FRAME };
                out.extend_from_slice(&window.to_le_bytes());
                put_rect(out, rect);
                out.extend_from_slice(&stride.to_le_bytes());
                let inline = match source {
                    Source::Inline(b) => {
                        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                        Some(b)
                    }
                    Source::Attachment(n) => {
                        flags |= F_ATTACHED;
                        out.extend_from_slice(&n.to_le_bytes());
                        None
                    }
                };
                if let Request::PresentFrame { tag, due_ns, .. } = *self {
                    out.extend_from_slice(&tag.to_le_bytes());
                    out.extend_from_slice(&due_ns.to_le_bytes());
                }
                if let Some(b) = inline {
                    out.extend_from_slice(b);
                }
            }
            Request::Sync { serial, shown } => {
                opcode = op::SYNC;
                flags |= if shown { F_SHOWN } else { 0 };
                out.extend_from_slice(&serial.to_le_bytes());
            }
        }
        finish(out, start, opcode, flags);
    }
}

/// Pad to 4 and fill in the header of the record that starts at `start`.
fn finish(out: &mut Vec<u8>, start: usize, code: u8, flags: u8) {
    while (out.len() - start) % 4 != 0 {
        out.push(0);
    }
    let len = (out.len() - start) as u32;
    out[start] = code;
    out[start + 1] = flags;
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
}

/// Encode items (rectangles, segments) for a request.
pub fn items<'b, T: Item>(list: &[T], buf: &'b mut Vec<u8>) -> Items<'b, T> {
    buf.clear();
    for i in list {
        i.write(buf);
    }
    Items { bytes: buf, _t: std::marker::PhantomData }
}

/// Error codes of [`Message::Error`].
pub mod error {
    /// No such window of this client.
    pub const BAD_WINDOW: u16 = 1;
    /// A window id already in use.
    pub const ID_IN_USE: u16 = 2;
    /// A size or position out of range, or an image larger than its source.
    pub const BAD_GEOMETRY: u16 = 3;
    /// No such attachment.
    pub const BAD_ATTACHMENT: u16 = 4;
    /// Over this client's limit (windows, pixels, queued frames).
    pub const LIMIT: u16 = 5;
    /// The server could not do it (its X server refused).
    pub const FAILED: u16 = 6;
}

/// A message from the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    /// Everything before sync `serial` is done.
    Synced {
        /// The sync's serial.
        serial: u32,
        /// Nanoseconds the server spent executing this client's requests since the
        /// previous sync (the paper's "server time").
        exec_ns: u64,
        /// Requests executed since the previous sync.
        requests: u64,
        /// When the server began executing those requests (`CLOCK_MONOTONIC` ns).
        begun_ns: u64,
        /// For a sync with the screen: when the server sent its present to the X
        /// server, and when the X server acknowledged it (0 for a plain sync). With
        /// `begun_ns`, these split a round trip into the way in, our server, the X
        /// server and the way back.
        sent_ns: u64,
        /// See `sent_ns`.
        acked_ns: u64,
    },
    /// A request failed (the others went on).
    Error {
        /// What (see [`error`]).
        code: u16,
        /// The request's opcode.
        op: u8,
        /// The window it named.
        window: u32,
    },
    /// Part of a window was exposed (its contents are already back: the server keeps them).
    Expose {
        /// Which.
        window: u32,
        /// What part.
        rect: Rect,
    },
    /// A window's size or position changed (by the window manager or a request).
    Configure {
        /// Which.
        window: u32,
        /// Where it is now.
        rect: Rect,
    },
    /// A key went down or up.
    Key {
        /// Which window has the focus.
        window: u32,
        /// Down or up.
        press: bool,
        /// The X key code.
        keycode: u8,
        /// Modifiers.
        state: u16,
        /// Pointer x.
        x: i16,
        /// Pointer y.
        y: i16,
    },
    /// A pointer button went down or up.
    Button {
        /// Which window.
        window: u32,
        /// Down or up.
        press: bool,
        /// Which button.
        button: u8,
        /// Modifiers.
        state: u16,
        /// Pointer x.
        x: i16,
        /// Pointer y.
        y: i16,
    },
    /// The pointer moved.
    Motion {
        /// Which window.
        window: u32,
        /// Modifiers.
        state: u16,
        /// Pointer x.
        x: i16,
        /// Pointer y.
        y: i16,
    },
    /// A frame was shown, or dropped because a later one was due first.
    Frame {
        /// Which window.
        window: u32,
        /// The client's tag.
        tag: u32,
        /// When it was due (`CLOCK_MONOTONIC` ns).
        due_ns: u64,
        /// When the screen had it (the X server acknowledged), or when it was dropped.
        shown_ns: u64,
        /// Dropped, not shown.
        dropped: bool,
    },
}

impl Message {
    /// Append the encoded message to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; HEADER]);
        let mut flags = 0;
        let k = match *self {
            Message::Synced { serial, exec_ns, requests, begun_ns, sent_ns, acked_ns } => {
                out.extend_from_slice(&serial.to_le_bytes());
                out.extend_from_slice(&0u32.to_le_bytes());
                for v in [exec_ns, requests, begun_ns, sent_ns, acked_ns] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                kind::SYNCED
            }
            Message::Error { code, op, window } => {
                out.extend_from_slice(&code.to_le_bytes());
                out.extend_from_slice(&[op, 0]);
                out.extend_from_slice(&window.to_le_bytes());
                kind::ERROR
            }
            Message::Expose { window, rect } | Message::Configure { window, rect } => {
                out.extend_from_slice(&window.to_le_bytes());
                rect.write(out);
                if matches!(self, Message::Expose { .. }) {
                    kind::EXPOSE
                } else {
                    kind::CONFIGURE
                }
            }
            Message::Key { window, press, keycode: code, state, x, y }
            | Message::Button { window, press, button: code, state, x, y } => {
                out.extend_from_slice(&window.to_le_bytes());
                out.extend_from_slice(&[u8::from(press), code]);
                out.extend_from_slice(&state.to_le_bytes());
                out.extend_from_slice(&x.to_le_bytes());
                out.extend_from_slice(&y.to_le_bytes());
                if matches!(self, Message::Key { .. }) {
                    kind::KEY
                } else {
                    kind::BUTTON
                }
            }
            Message::Motion { window, state, x, y } => {
                out.extend_from_slice(&window.to_le_bytes());
                out.extend_from_slice(&state.to_le_bytes());
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(&x.to_le_bytes());
                out.extend_from_slice(&y.to_le_bytes());
                kind::MOTION
            }
            Message::Frame { window, tag, due_ns, shown_ns, dropped } => {
                flags = if dropped { F_DROPPED } else { 0 };
                out.extend_from_slice(&window.to_le_bytes());
                out.extend_from_slice(&tag.to_le_bytes());
                out.extend_from_slice(&due_ns.to_le_bytes());
                out.extend_from_slice(&shown_ns.to_le_bytes());
                kind::FRAME
            }
        };
        finish(out, start, k, flags);
    }

    /// Decode the message at the start of `buf`; returns it and its length. The client
    /// trusts its server no more than the server trusts it: everything is checked.
    pub fn decode(buf: &[u8]) -> Result<(Message, usize), DecodeError> {
        let (k, flags, len) = header(buf, 4096)?;
        let r = Rd(&buf[..len]);
        let exact = |n: usize| if len != n { Err(DecodeError::BadLength { op: k, len }) } else { Ok(()) };
        let only = |allowed: u8| if flags & !allowed != 0 { Err(DecodeError::Reserved(k)) } else { Ok(()) };
        let m = match k {
            kind::SYNCED => {
                exact(56)?;
                only(0)?;
                Message::Synced {
                    serial: r.u32(8),
                    exec_ns: r.u64(16),
                    requests: r.u64(24),
                    begun_ns: r.u64(32),
                    sent_ns: r.u64(40),
                    acked_ns: r.u64(48),
                }
            }
            kind::ERROR => {
                exact(16)?;
                only(0)?;
                Message::Error { code: r.u16(8), op: buf[10], window: r.u32(12) }
            }
            kind::EXPOSE | kind::CONFIGURE => {
                exact(20)?;
                only(0)?;
                let (window, rect) = (r.u32(8), r.rect(12));
                if k == kind::EXPOSE {
                    Message::Expose { window, rect }
                } else {
                    Message::Configure { window, rect }
                }
            }
            kind::KEY | kind::BUTTON => {
                exact(20)?;
                only(0)?;
                let (window, press, code, state, x, y) =
                    (r.u32(8), buf[12] != 0, buf[13], r.u16(14), r.i16(16), r.i16(18));
                if k == kind::KEY {
                    Message::Key { window, press, keycode: code, state, x, y }
                } else {
                    Message::Button { window, press, button: code, state, x, y }
                }
            }
            kind::MOTION => {
                exact(20)?;
                only(0)?;
                Message::Motion { window: r.u32(8), state: r.u16(12), x: r.i16(16), y: r.i16(18) }
            }
            kind::FRAME => {
                exact(32)?;
                only(F_DROPPED)?;
                Message::Frame {
                    window: r.u32(8),
                    tag: r.u32(12),
                    due_ns: r.u64(16),
                    shown_ns: r.u64(24),
                    dropped: flags & F_DROPPED != 0,
                }
            }
            other => return Err(DecodeError::UnknownOp(other)),
        };
        Ok((m, len))
    }
}

/// The fuzz target's body (`fuzz/fuzz_targets/display_request.rs`): decode `data` as a
/// batch of requests, and as messages, checking the decoder's promises; returns how
/// many requests the whole batch holds, or `None` if it is not a valid batch.
///
/// Promises: a decoded request never claims more bytes than there are, is a multiple
/// of 4 long, and encodes to bytes that decode to the same request.
pub fn fuzz_batch(data: &[u8]) -> Option<usize> {
    let mut rest = data;
    while !rest.is_empty() {
        let Ok((m, n)) = Message::decode(rest) else { break };
        assert!(n <= rest.len() && n % 4 == 0 && n >= HEADER);
        let mut again = Vec::new();
        m.encode(&mut again);
        assert_eq!(Message::decode(&again), Ok((m, again.len())), "a message does not survive re-encoding");
        rest = &rest[n..];
    }
    let mut rest = data;
    let mut count = 0;
    while !rest.is_empty() {
        let (req, n) = Request::decode(rest).ok()?;
        assert!(n <= rest.len() && n % 4 == 0 && n >= HEADER, "a request claims {n} of {} bytes", rest.len());
        let mut again = Vec::new();
        req.encode(&mut again);
        let (back, m) = Request::decode(&again).expect("a decoded request encodes to a valid one");
        assert_eq!((back, m), (req, again.len()), "a request does not survive re-encoding");
        rest = &rest[n..];
        count += 1;
    }
    Some(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(r: Request<'_>) {
        let mut out = Vec::new();
        r.encode(&mut out);
        assert_eq!(out.len() % 4, 0);
        let (back, n) = Request::decode(&out).expect("decodes");
        assert_eq!(n, out.len());
        assert_eq!(back, r);
    }

    #[test]
    fn every_request_round_trips() {
        let mut rb = Vec::new();
        let mut sb = Vec::new();
        let rects = items(&[Rect::new(-3, 4, 5, 6), Rect::new(1, 2, 3, 4)], &mut rb);
        let segs = items(&[Segment { x1: 1, y1: 2, x2: -3, y2: 4 }], &mut sb);
        let img = [7u8; 4 * 3 * 2];
        for r in [
            Request::CreateWindow { id: 5, parent: 0, rect: Rect::new(1, 2, 300, 200), background: 0xff00ff },
            Request::DestroyWindow { id: 5 },
            Request::ConfigureWindow { id: 5, rect: Rect::new(0, 0, 10, 10) },
            Request::SetTitle { id: 5, title: b"hello" },
            Request::FillRects { window: 5, op: RasterOp::Xor, color: 0xffffff, rects },
            Request::Segments { window: 5, op: RasterOp::Copy, color: 1, segments: segs },
            Request::Text { window: 5, x: 1, y: 2, fg: 3, bg: Some(4), text: b"abc" },
            Request::Text { window: 5, x: 1, y: 2, fg: 3, bg: None, text: b"" },
            Request::CopyArea { window: 5, src: Rect::new(0, 8, 100, 100), dx: 0, dy: 0 },
            Request::PutImage { window: 5, rect: Rect::new(0, 0, 3, 2), stride: 12, source: Source::Inline(&img) },
            Request::PresentFrame {
                window: 5,
                rect: Rect::new(0, 0, 640, 480),
                stride: 2560,
                source: Source::Attachment(9),
                tag: 77,
                due_ns: 123_456_789,
            },
            Request::Sync { serial: 3, shown: true },
        ] {
            round_trip(r);
        }
    }

    #[test]
    fn every_message_round_trips() {
        for m in [
            Message::Synced { serial: 1, exec_ns: 2, requests: 3, begun_ns: 4, sent_ns: 5, acked_ns: 6 },
            Message::Error { code: error::BAD_WINDOW, op: op::FILL_RECTS, window: 9 },
            Message::Expose { window: 1, rect: Rect::new(1, 2, 3, 4) },
            Message::Configure { window: 1, rect: Rect::new(1, 2, 3, 4) },
            Message::Key { window: 1, press: true, keycode: 38, state: 1, x: 5, y: 6 },
            Message::Button { window: 1, press: false, button: 3, state: 0, x: -5, y: 6 },
            Message::Motion { window: 1, state: 0, x: 5, y: 6 },
            Message::Frame { window: 1, tag: 2, due_ns: 3, shown_ns: 4, dropped: true },
        ] {
            let mut out = Vec::new();
            m.encode(&mut out);
            assert_eq!(Message::decode(&out), Ok((m, out.len())));
        }
    }

    #[test]
    fn nonsense_is_refused_with_a_reason() {
        let mut out = Vec::new();
        Request::Sync { serial: 1, shown: false }.encode(&mut out);
        assert!(matches!(Request::decode(&out[..7]), Err(DecodeError::Truncated { .. })));
        let mut bad = out.clone();
        bad[0] = 99;
        assert_eq!(Request::decode(&bad), Err(DecodeError::UnknownOp(99)));
        let mut bad = out.clone();
        bad[1] = 0x80;
        assert_eq!(Request::decode(&bad), Err(DecodeError::Reserved(op::SYNC)));
        let mut bad = out.clone();
        bad[4] = 13;
        assert!(matches!(Request::decode(&bad), Err(DecodeError::BadLength { .. })));
        // An image whose stated size does not match its bytes.
        let img = [0u8; 16];
        let mut out = Vec::new();
        Request::PutImage { window: 1, rect: Rect::new(0, 0, 2, 2), stride: 8, source: Source::Inline(&img) }
            .encode(&mut out);
        out[20] = 4; // stride 4 < 2 pixels
        assert_eq!(Request::decode(&out), Err(DecodeError::BadGeometry(op::PUT_IMAGE)));
        // A window of zero width.
        let mut out = Vec::new();
        Request::CreateWindow { id: 1, parent: 0, rect: Rect::new(0, 0, 0, 5), background: 0 }.encode(&mut out);
        assert_eq!(Request::decode(&out), Err(DecodeError::BadGeometry(op::CREATE_WINDOW)));
    }

    proptest! {
        #[test]
        fn decoding_never_panics_and_never_reads_past_its_length(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok((_, n)) = Request::decode(&bytes) {
                prop_assert!(n <= bytes.len() && n % 4 == 0 && n >= HEADER);
            }
            let _ = Message::decode(&bytes);
            let _ = peek_len(&bytes);
        }

        #[test]
        fn fill_rects_round_trip(list in proptest::collection::vec((any::<i16>(), any::<i16>(), any::<u16>(), any::<u16>()), 0..40), color: u32, xor: bool) {
            let rects: Vec<Rect> = list.into_iter().map(|(x, y, w, h)| Rect { x, y, w, h }).collect();
            let mut b = Vec::new();
            let it = items(&rects, &mut b);
            let op = if xor { RasterOp::Xor } else { RasterOp::Copy };
            let mut out = Vec::new();
            Request::FillRects { window: 1, op, color, rects: it }.encode(&mut out);
            let (back, _) = Request::decode(&out).expect("decodes");
            let Request::FillRects { rects: got, op: o, color: c, .. } = back else { panic!("not a fill") };
            prop_assert_eq!(got.iter().collect::<Vec<_>>(), rects);
            prop_assert_eq!((o, c), (op, color));
        }
    }
}
