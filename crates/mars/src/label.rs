//! The volume's label: the stripe table and the streams it holds, as written at the start
//! of every component (the paper's ccd, 001 §4.4), and the stripe map from a volume
//! offset to the components' blocks.
//!
//! # On disk
//!
//! Every component (a file or a block device) begins with [`LABEL_BYTES`] of label; its
//! data area follows, so data offsets stay aligned for `O_DIRECT`. All integers are
//! little-endian.
//!
//! | offset | bytes | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `ICTMARS1` |
//! | 8 | 4 | version (1) |
//! | 12 | 4 | interleave: bytes per stripe unit, a multiple of [`ALIGN`] |
//! | 16 | 8 | volume id (random; every component of a volume has the same) |
//! | 24 | 2 | component count *n* (1 ..= [`MAX_COMPONENTS`]) |
//! | 26 | 2 | this component's index (< *n*) |
//! | 28 | 4 | stream count *s* (≤ [`MAX_STREAMS`]) |
//! | 32 | 8 | data bytes per component (a multiple of the interleave) |
//! | 40 | 8 | generation: bumped on every change of the table |
//! | 48 | 8 | FNV-1a 64 of bytes 0..48 and of the *s* stream entries |
//! | 56 | 8 | reserved, zero |
//! | 64 | 96 × *s* | stream entries |
//!
//! A stream entry: name length (1 byte, 1 ..= [`MAX_NAME`]), the name (64 bytes, zero
//! padded), start in the volume (8, a multiple of the interleave), length (8), the
//! generation at which it was written (8), 7 bytes reserved.
//!
//! # The stripe map
//!
//! Volume offset `v` lies in stripe unit `u = v / interleave`, on component `u mod n`, in
//! that component's stripe `u / n`, at component byte
//! `LABEL_BYTES + (u / n) × interleave + v mod interleave`. A read of several stripe
//! units thus becomes reads on several components at once, which is where striping's
//! throughput comes from. ccd allows components of different sizes; we stripe over the
//! smallest (the rest of a larger one is unused), so every stripe has all components.

use std::fmt;

/// Bytes of label at the start of each component; data starts here.
pub const LABEL_BYTES: u64 = 64 << 10;
/// Alignment of the interleave, of data offsets and of `O_DIRECT` transfers.
pub const ALIGN: u64 = 4096;
/// Most components in a volume.
pub const MAX_COMPONENTS: usize = 64;
/// Longest stream name, in bytes.
pub const MAX_NAME: usize = 64;
/// Bytes of one stream entry.
pub const ENTRY_BYTES: usize = 96;
/// Bytes of the header before the entries.
pub const HEADER_BYTES: usize = 64;
/// Most streams a volume holds (what fits in the label).
pub const MAX_STREAMS: usize = (LABEL_BYTES as usize - HEADER_BYTES) / ENTRY_BYTES;
/// Largest interleave accepted (16 MiB).
pub const MAX_INTERLEAVE: u64 = 16 << 20;
const MAGIC: &[u8; 8] = b"ICTMARS1";
const VERSION: u32 = 1;

/// A volume's geometry: how its bytes are spread over the components.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per stripe unit.
    pub interleave: u64,
    /// Number of components.
    pub components: u16,
    /// Data bytes each component holds (a multiple of the interleave).
    pub component_data_bytes: u64,
}

/// One contiguous piece of a volume read or write on one component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Which component.
    pub component: u16,
    /// Byte offset on the component (label included).
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Where the piece goes in the caller's buffer (bytes from the start of the request).
    pub at: u64,
}

impl Geometry {
    /// Checks a geometry; the reason if it is unusable.
    pub fn new(interleave: u64, components: u16, component_data_bytes: u64) -> Result<Geometry, LabelError> {
        if interleave == 0 || interleave % ALIGN != 0 || interleave > MAX_INTERLEAVE {
            return Err(LabelError::BadInterleave(interleave));
        }
        if components == 0 || usize::from(components) > MAX_COMPONENTS {
            return Err(LabelError::BadComponentCount(components));
        }
        let component_data_bytes = component_data_bytes - component_data_bytes % interleave;
        if component_data_bytes == 0 {
            return Err(LabelError::TooSmall);
        }
        // The volume's size must fit a u64 with room for offsets past it.
        if component_data_bytes.checked_mul(u64::from(components)).map_or(true, |v| v > u64::MAX / 2) {
            return Err(LabelError::TooLarge);
        }
        Ok(Geometry { interleave, components, component_data_bytes })
    }

    /// The volume's capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.component_data_bytes * u64::from(self.components)
    }

    /// Where volume byte `v` lives: (component, byte offset on the component).
    pub fn locate(&self, v: u64) -> (u16, u64) {
        let unit = v / self.interleave;
        let n = u64::from(self.components);
        let component = (unit % n) as u16;
        (component, LABEL_BYTES + (unit / n) * self.interleave + v % self.interleave)
    }

    /// The pieces of the volume range `[offset, offset + len)`, in volume order, each
    /// within one stripe unit. Empty if the range is empty or leaves the volume.
    pub fn map(&self, offset: u64, len: u64) -> Pieces {
        let end = offset.checked_add(len).filter(|&e| e <= self.capacity());
        Pieces { geometry: *self, next: offset, end: end.unwrap_or(offset), start: offset }
    }
}

/// Iterator over the [`Piece`]s of a volume range ([`Geometry::map`]).
#[derive(Clone, Debug)]
pub struct Pieces {
    geometry: Geometry,
    start: u64,
    next: u64,
    end: u64,
}

impl Iterator for Pieces {
    type Item = Piece;
    fn next(&mut self) -> Option<Piece> {
        if self.next >= self.end {
            return None;
        }
        let g = &self.geometry;
        let (component, offset) = g.locate(self.next);
        let in_unit = g.interleave - self.next % g.interleave;
        let len = in_unit.min(self.end - self.next);
        let piece = Piece { component, offset, len, at: self.next - self.start };
        self.next += len;
        Some(piece)
    }
}

/// A stream stored on the volume: a name and a contiguous range of volume bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamEntry {
    /// The stream's name (see [`valid_name`]).
    pub name: String,
    /// First volume byte (a multiple of the interleave).
    pub start: u64,
    /// Bytes.
    pub len: u64,
    /// The label generation at which it was written; with the volume id, its ETag.
    pub generation: u64,
}

/// The label of one component: the volume's geometry, its id and its streams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    /// The volume's id, the same on every component.
    pub volume_id: u64,
    /// This component's index.
    pub index: u16,
    /// The geometry.
    pub geometry: Geometry,
    /// Bumped on every change to the streams.
    pub generation: u64,
    /// The streams, in volume order.
    pub streams: Vec<StreamEntry>,
}

/// Why a label was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// Fewer bytes than a label.
    #[error("short label: {0} bytes")]
    Short(usize),
    /// Not an ictus MARS component.
    #[error("not an ictus MARS volume component (bad magic)")]
    BadMagic,
    /// A version we do not read.
    #[error("unsupported label version {0}")]
    BadVersion(u32),
    /// Interleave zero, unaligned or too large.
    #[error("bad interleave {0} (a multiple of 4096 up to 16 MiB)")]
    BadInterleave(u64),
    /// Zero or too many components.
    #[error("bad component count {0} (1 to 64)")]
    BadComponentCount(u16),
    /// The component's index is not below the count.
    #[error("component index {index} of {count}")]
    BadIndex {
        /// The index read.
        index: u16,
        /// The count read.
        count: u16,
    },
    /// Too many streams for the label.
    #[error("{0} streams (at most {MAX_STREAMS})")]
    TooManyStreams(u32),
    /// The checksum does not match.
    #[error("label checksum mismatch")]
    Checksum,
    /// A reserved field is not zero.
    #[error("reserved bytes are not zero")]
    Reserved,
    /// A stream name is empty, too long or has characters outside the allowed set.
    #[error("bad stream name {0:?}")]
    BadName(String),
    /// Two streams with one name.
    #[error("stream {0:?} appears twice")]
    DuplicateName(String),
    /// A stream leaves the volume, starts unaligned, or overlaps the previous one.
    #[error("stream {0:?} is misplaced (unaligned, overlapping or past the end)")]
    BadExtent(String),
    /// The components are too small to hold one stripe unit each.
    #[error("components too small for one stripe unit")]
    TooSmall,
    /// The volume would not fit in 63 bits.
    #[error("volume too large")]
    TooLarge,
}

/// Whether `name` may name a stream: 1 to 64 bytes of `A-Z a-z 0-9 . _ -` and `/`, not
/// starting with `/` or `.`, with no empty, `.` or `..` path component. This is also
/// what an HTTP path may name, so no decoding ambiguity reaches the volume.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'))
        && !name.starts_with(['/', '.'])
        && name.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// FNV-1a, 64 bits.
fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Label {
    /// Checks the streams against the geometry: names valid and distinct, extents
    /// aligned, inside the volume and not overlapping, in volume order.
    pub fn validate(&self) -> Result<(), LabelError> {
        let g = &self.geometry;
        Geometry::new(g.interleave, g.components, g.component_data_bytes)?;
        if self.index >= g.components {
            return Err(LabelError::BadIndex { index: self.index, count: g.components });
        }
        if self.streams.len() > MAX_STREAMS {
            return Err(LabelError::TooManyStreams(self.streams.len() as u32));
        }
        let mut names: Vec<&str> = self.streams.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(LabelError::DuplicateName(w[0].to_string()));
        }
        let mut end = 0u64;
        for s in &self.streams {
            if !valid_name(&s.name) {
                return Err(LabelError::BadName(s.name.clone()));
            }
            let fits = s.start.checked_add(s.len).is_some_and(|e| e <= g.capacity());
            if s.start % g.interleave != 0 || s.start < end || !fits {
                return Err(LabelError::BadExtent(s.name.clone()));
            }
            end = s.start + s.len;
        }
        Ok(())
    }

    /// The first interleave-aligned volume byte after every stream.
    pub fn free_start(&self) -> u64 {
        let end = self.streams.last().map_or(0, |s| s.start + s.len);
        end.next_multiple_of(self.geometry.interleave)
    }

    /// The stream called `name`.
    pub fn find(&self, name: &str) -> Option<&StreamEntry> {
        self.streams.iter().find(|s| s.name == name)
    }

    /// The label's bytes: [`LABEL_BYTES`] long, ready to write at offset 0.
    pub fn encode(&self) -> Result<Vec<u8>, LabelError> {
        self.validate()?;
        let g = &self.geometry;
        let mut b = vec![0u8; LABEL_BYTES as usize];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(g.interleave as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.volume_id.to_le_bytes());
        b[24..26].copy_from_slice(&g.components.to_le_bytes());
        b[26..28].copy_from_slice(&self.index.to_le_bytes());
        b[28..32].copy_from_slice(&(self.streams.len() as u32).to_le_bytes());
        b[32..40].copy_from_slice(&g.component_data_bytes.to_le_bytes());
        b[40..48].copy_from_slice(&self.generation.to_le_bytes());
        for (i, s) in self.streams.iter().enumerate() {
            let e = &mut b[HEADER_BYTES + i * ENTRY_BYTES..HEADER_BYTES + (i + 1) * ENTRY_BYTES];
            e[0] = s.name.len() as u8;
            e[1..1 + s.name.len()].copy_from_slice(s.name.as_bytes());
            e[65..73].copy_from_slice(&s.start.to_le_bytes());
            e[73..81].copy_from_slice(&s.len.to_le_bytes());
            e[81..89].copy_from_slice(&s.generation.to_le_bytes());
        }
        let sum = Self::checksum(&b, self.streams.len());
        b[48..56].copy_from_slice(&sum.to_le_bytes());
        Ok(b)
    }

    fn checksum(b: &[u8], streams: usize) -> u64 {
        let h = fnv1a(FNV_OFFSET, &b[..48]);
        fnv1a(h, &b[HEADER_BYTES..HEADER_BYTES + streams * ENTRY_BYTES])
    }

    /// Reads a label from the first bytes of a component: untrusted bytes, checked field
    /// by field before any is used; a label that decodes is valid ([`Label::validate`]).
    pub fn decode(b: &[u8]) -> Result<Label, LabelError> {
        if b.len() < HEADER_BYTES {
            return Err(LabelError::Short(b.len()));
        }
        if &b[0..8] != MAGIC {
            return Err(LabelError::BadMagic);
        }
        let version = le_u32(b, 8);
        if version != VERSION {
            return Err(LabelError::BadVersion(version));
        }
        let count = le_u32(b, 28);
        if count as usize > MAX_STREAMS {
            return Err(LabelError::TooManyStreams(count));
        }
        let count = count as usize;
        let need = HEADER_BYTES + count * ENTRY_BYTES;
        if b.len() < need {
            return Err(LabelError::Short(b.len()));
        }
        if Self::checksum(b, count) != le_u64(b, 48) {
            return Err(LabelError::Checksum);
        }
        if b[56..64].iter().any(|&x| x != 0) {
            return Err(LabelError::Reserved);
        }
        let geometry = Geometry::new(u64::from(le_u32(b, 12)), le_u16(b, 24), le_u64(b, 32))?;
        if geometry.component_data_bytes != le_u64(b, 32) {
            return Err(LabelError::BadInterleave(geometry.interleave));
        }
        let mut streams = Vec::with_capacity(count);
        for i in 0..count {
            let e = &b[HEADER_BYTES + i * ENTRY_BYTES..HEADER_BYTES + (i + 1) * ENTRY_BYTES];
            let n = usize::from(e[0]);
            if n == 0 || n > MAX_NAME || e[1 + n..65].iter().any(|&x| x != 0) || e[89..].iter().any(|&x| x != 0) {
                return Err(LabelError::BadName(String::from_utf8_lossy(&e[1..1 + n.min(MAX_NAME)]).into_owned()));
            }
            let name = std::str::from_utf8(&e[1..1 + n])
                .map_err(|_| LabelError::BadName(String::from_utf8_lossy(&e[1..1 + n]).into_owned()))?;
            streams.push(StreamEntry {
                name: name.to_string(),
                start: le_u64(e, 65),
                len: le_u64(e, 73),
                generation: le_u64(e, 81),
            });
        }
        let label =
            Label { volume_id: le_u64(b, 16), index: le_u16(b, 26), geometry, generation: le_u64(b, 40), streams };
        label.validate()?;
        Ok(label)
    }
}

impl fmt::Display for Geometry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} component(s) × {} bytes, interleave {} bytes, capacity {} bytes",
            self.components,
            self.component_data_bytes,
            self.interleave,
            self.capacity()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label() -> Label {
        Label {
            volume_id: 0x1234_5678,
            index: 1,
            geometry: Geometry::new(64 << 10, 2, 10 << 20).unwrap(),
            generation: 3,
            streams: vec![
                StreamEntry { name: "a.ts".into(), start: 0, len: 100_000, generation: 1 },
                StreamEntry { name: "clips/b.mp4".into(), start: 128 << 10, len: 5, generation: 3 },
            ],
        }
    }

    #[test]
    fn a_label_round_trips() {
        let l = label();
        let b = l.encode().unwrap();
        assert_eq!(b.len() as u64, LABEL_BYTES);
        assert_eq!(Label::decode(&b).unwrap(), l);
    }

    #[test]
    fn any_flipped_byte_in_the_used_part_is_refused() {
        let b = label().encode().unwrap();
        for i in 0..HEADER_BYTES + 2 * ENTRY_BYTES {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(Label::decode(&c).is_err(), "byte {i} flipped was accepted");
        }
    }

    #[test]
    fn bad_tables_are_refused_before_encoding() {
        let mut l = label();
        l.streams[1].start = 4096; // unaligned and overlapping
        assert!(matches!(l.encode(), Err(LabelError::BadExtent(_))));
        let mut l = label();
        l.streams[1].name = "a.ts".into();
        assert!(matches!(l.encode(), Err(LabelError::DuplicateName(_))));
        let mut l = label();
        l.streams[1].len = u64::MAX;
        assert!(matches!(l.encode(), Err(LabelError::BadExtent(_))));
        let mut l = label();
        l.index = 2;
        assert!(matches!(l.encode(), Err(LabelError::BadIndex { .. })));
    }

    #[test]
    fn names() {
        for ok in ["a", "a.ts", "clips/x-1_2.m3u8", "A/B/C"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "/a", ".a", "a//b", "a/../b", "a/./b", "a b", "a%20", "ü", &"x".repeat(65), "a/"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_stripe_map_alternates_components() {
        let g = Geometry::new(4096, 2, 1 << 20).unwrap();
        assert_eq!(g.locate(0), (0, LABEL_BYTES));
        assert_eq!(g.locate(4096), (1, LABEL_BYTES));
        assert_eq!(g.locate(8192 + 5), (0, LABEL_BYTES + 4096 + 5));
        let pieces: Vec<Piece> = g.map(4000, 5000).collect();
        assert_eq!(
            pieces,
            vec![
                Piece { component: 0, offset: LABEL_BYTES + 4000, len: 96, at: 0 },
                Piece { component: 1, offset: LABEL_BYTES, len: 4096, at: 96 },
                Piece { component: 0, offset: LABEL_BYTES + 4096, len: 808, at: 4192 },
            ]
        );
        assert_eq!(g.map(g.capacity() - 1, 2).count(), 0, "a range past the end maps to nothing");
        assert_eq!(g.map(u64::MAX, 2).count(), 0);
    }
}
