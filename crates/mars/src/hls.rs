//! HLS playlists with byte ranges (RFC 8216 §4.3.2.2 `EXT-X-BYTERANGE`) for MPEG
//! transport streams: the clip is indexed once, when it is added to the volume, by
//! reading each 188-byte packet's adaptation field for its program clock reference (PCR)
//! and random-access flag; segments are cut at random-access points once the target
//! duration has passed. The playlist is stored on the volume beside the clip and served
//! like any stream.

/// Bytes per transport stream packet.
pub const TS_PACKET: usize = 188;
const PCR_WRAP: u64 = 1 << 33;

/// A point in the clip: a packet with a PCR.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// Byte offset of the packet.
    pub offset: u64,
    /// PCR base in seconds, unwrapped (monotonic).
    pub seconds: f64,
    /// Whether the packet starts a random-access point.
    pub random_access: bool,
}

/// Why a clip could not be indexed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// A packet does not start with the sync byte 0x47.
    #[error("lost sync at byte {0}: not an MPEG transport stream")]
    Sync(u64),
    /// No packet carries a PCR, so durations are unknown.
    #[error("no program clock reference in the clip")]
    NoClock,
}

/// Indexes a transport stream fed in pieces (any sizes, in order).
#[derive(Clone, Debug, Default)]
pub struct TsIndexer {
    partial: Vec<u8>,
    offset: u64,
    last_base: Option<u64>,
    wraps: u64,
    /// The points found so far.
    pub points: Vec<Point>,
    failed: Option<IndexError>,
}

impl TsIndexer {
    /// A new indexer.
    pub fn new() -> TsIndexer {
        TsIndexer::default()
    }

    /// Feeds the next bytes of the clip.
    pub fn feed(&mut self, mut data: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if !self.partial.is_empty() {
            let take = (TS_PACKET - self.partial.len()).min(data.len());
            self.partial.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.partial.len() == TS_PACKET {
                let p = std::mem::take(&mut self.partial);
                self.packet(&p);
            }
        }
        let mut chunks = data.chunks_exact(TS_PACKET);
        for p in &mut chunks {
            self.packet(p);
            if self.failed.is_some() {
                return;
            }
        }
        self.partial.extend_from_slice(chunks.remainder());
    }

    fn packet(&mut self, p: &[u8]) {
        let offset = self.offset;
        self.offset += TS_PACKET as u64;
        if p[0] != 0x47 {
            self.failed = Some(IndexError::Sync(offset));
            return;
        }
        let afc = (p[3] >> 4) & 3;
        if afc & 2 == 0 || p[4] == 0 {
            return;
        }
        let af_len = usize::from(p[4]);
        let flags = p[5];
        let random_access = flags & 0x40 != 0;
        // A PCR needs the flags byte and 6 bytes inside the adaptation field.
        if flags & 0x10 == 0 || af_len < 7 {
            return;
        }
        let base = (u64::from(p[6]) << 25)
            | (u64::from(p[7]) << 17)
            | (u64::from(p[8]) << 9)
            | (u64::from(p[9]) << 1)
            | (u64::from(p[10]) >> 7);
        if self.last_base.is_some_and(|last| base + PCR_WRAP / 2 < last) {
            self.wraps += 1;
        }
        self.last_base = Some(base);
        let seconds = (base + self.wraps * PCR_WRAP) as f64 / 90_000.0;
        self.points.push(Point { offset, seconds, random_access });
    }

    /// The segments of a clip of `len` bytes, cut at random-access points (or at any
    /// PCR if the clip marks none) once `target` seconds have passed.
    pub fn segments(&self, len: u64, target: f64) -> Result<Vec<Segment>, IndexError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let first = self.points.first().ok_or(IndexError::NoClock)?;
        let any_rai = self.points.iter().any(|p| p.random_access);
        let mut out = Vec::new();
        let (mut seg_start, mut seg_time) = (0u64, first.seconds);
        for p in &self.points {
            if p.offset > seg_start && (p.random_access || !any_rai) && p.seconds - seg_time >= target {
                out.push(Segment { offset: seg_start, len: p.offset - seg_start, seconds: p.seconds - seg_time });
                seg_start = p.offset;
                seg_time = p.seconds;
            }
        }
        let last = self.points.last().map_or(seg_time, |p| p.seconds);
        if len > seg_start {
            // The last segment's duration: to the last PCR, or the mean rate if none after.
            let secs = if last > seg_time { last - seg_time } else { target };
            out.push(Segment { offset: seg_start, len: len - seg_start, seconds: secs });
        }
        Ok(out)
    }
}

/// One playlist segment: a byte range of the clip and its duration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Segment {
    /// First byte.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Seconds.
    pub seconds: f64,
}

/// The playlist (VOD, version 4) for `uri` cut into `segments`.
pub fn playlist(uri: &str, segments: &[Segment]) -> String {
    let target = segments.iter().map(|s| s.seconds.ceil() as u64).max().unwrap_or(1).max(1);
    let mut out = format!(
        "#EXTM3U\n#EXT-X-VERSION:4\n#EXT-X-TARGETDURATION:{target}\n#EXT-X-MEDIA-SEQUENCE:0\n#EXT-X-PLAYLIST-TYPE:VOD\n"
    );
    for s in segments {
        out.push_str(&format!("#EXTINF:{:.3},\n#EXT-X-BYTERANGE:{}@{}\n{uri}\n", s.seconds, s.len, s.offset));
    }
    out.push_str("#EXT-X-ENDLIST\n");
    out
}

/// A synthetic transport stream, for tests and demos: `seconds` of packets at
/// `packets_per_second`, a PCR in every packet, a random-access point each second.
pub fn synthetic_ts(seconds: u32, packets_per_second: u32) -> Vec<u8> {
    let n = seconds as usize * packets_per_second as usize;
    let mut out = Vec::with_capacity(n * TS_PACKET);
    for i in 0..n {
        let mut p = [0xffu8; TS_PACKET];
        p[0] = 0x47;
        p[1] = 0x01; // PID 0x100
        p[2] = 0x00;
        p[3] = 0x30 | (i as u8 & 0x0f); // adaptation field and payload
        p[4] = 7;
        let rai = i % packets_per_second as usize == 0;
        p[5] = 0x10 | if rai { 0x40 } else { 0 };
        let base = (i as u64 * 90_000 / u64::from(packets_per_second)) % PCR_WRAP;
        p[6] = (base >> 25) as u8;
        p[7] = (base >> 17) as u8;
        p[8] = (base >> 9) as u8;
        p[9] = (base >> 1) as u8;
        p[10] = ((base & 1) << 7) as u8 | 0x7e;
        p[11] = 0;
        for (j, b) in p[12..].iter_mut().enumerate() {
            *b = (i + j) as u8;
        }
        out.extend_from_slice(&p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_synthetic_clip_is_cut_at_random_access_points() {
        let ts = synthetic_ts(10, 50);
        let mut ix = TsIndexer::new();
        for piece in ts.chunks(1000) {
            ix.feed(piece);
        }
        assert_eq!(ix.points.len(), 500);
        let segs = ix.segments(ts.len() as u64, 4.0).unwrap();
        assert_eq!(segs.len(), 3);
        assert_eq!(segs[0].offset, 0);
        assert_eq!(segs[1].offset, 200 * TS_PACKET as u64);
        assert!((segs[0].seconds - 4.0).abs() < 1e-9);
        assert_eq!(segs.iter().map(|s| s.len).sum::<u64>(), ts.len() as u64);
        let pl = playlist("clip.ts", &segs);
        assert!(pl.starts_with("#EXTM3U\n") && pl.ends_with("#EXT-X-ENDLIST\n"));
        assert!(pl.contains(&format!("#EXT-X-BYTERANGE:{}@0\nclip.ts\n", 200 * TS_PACKET)));
    }

    #[test]
    fn garbage_is_not_a_transport_stream() {
        let mut ix = TsIndexer::new();
        ix.feed(&[0u8; 400]);
        assert_eq!(ix.segments(400, 4.0), Err(IndexError::Sync(0)));
        let mut ix = TsIndexer::new();
        ix.feed(&[0x47u8; 188]);
        assert_eq!(ix.segments(188, 4.0), Err(IndexError::NoClock));
    }
}
