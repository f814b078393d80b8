//! YUV4MPEG2 (`.y4m`): uncompressed video, a text header and frames of planar YUV.
//!
//! ```text
//! YUV4MPEG2 W160 H120 F10:1 Ip A1:1 C420jpeg\n
//! FRAME\n  <Y plane><U plane><V plane>
//! FRAME\n  …
//! ```
//!
//! Read with [`Y4mReader`]: the header is parsed and checked (8-bit 4:2:0, 4:2:2,
//! 4:4:4 and mono; sizes up to 8192×8192; a positive frame rate), then each frame is
//! read whole into the caller's buffer and converted to `0x00RRGGBB` pixels
//! ([`yuv_to_rgb`], BT.601 limited range) where it goes. A file cut short is an error
//! that says which frame, never a hang or a short frame shown.

use std::io::{self, BufRead, Read};

/// The largest header or frame-header line.
const MAX_LINE: usize = 4096;
/// The largest width or height.
pub const MAX_SIDE: u32 = 8192;

/// Chroma layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chroma {
    /// 4:2:0 (any siting).
    C420,
    /// 4:2:2.
    C422,
    /// 4:4:4.
    C444,
    /// Luma only.
    Mono,
}

/// A validated Y4M header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Y4mHeader {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Frame rate numerator.
    pub fps_num: u32,
    /// Frame rate denominator.
    pub fps_den: u32,
    /// Chroma layout.
    pub chroma: Chroma,
}

/// Why a Y4M stream could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Y4mError {
    /// Not a YUV4MPEG2 stream, or a header field we cannot use.
    #[error("not a usable YUV4MPEG2 header: {0}")]
    Header(String),
    /// A frame header that is not `FRAME…`.
    #[error("frame {frame}: bad frame header")]
    FrameHeader {
        /// Which frame (from 0).
        frame: u64,
    },
    /// The file ends inside a frame.
    #[error("frame {frame}: the file ends {missing} bytes short of the frame (truncated)")]
    Truncated {
        /// Which frame.
        frame: u64,
        /// Bytes missing.
        missing: usize,
    },
    /// Reading failed.
    #[error("reading: {0}")]
    Io(#[from] io::Error),
}

impl Y4mHeader {
    /// Parse the header line (without its newline).
    pub fn parse(line: &[u8]) -> Result<Y4mHeader, Y4mError> {
        let bad = |s: String| Y4mError::Header(s);
        // ASCII, as the format says (and so every split below is at a character).
        if !line.is_ascii() {
            return Err(bad("not ASCII".into()));
        }
        let text = std::str::from_utf8(line).map_err(|_| bad("not ASCII".into()))?;
        let mut words = text.split(' ');
        if words.next() != Some("YUV4MPEG2") {
            return Err(bad("no YUV4MPEG2 signature".into()));
        }
        let (mut w, mut h, mut f, mut c) = (None, None, None, Chroma::C420);
        for word in words.filter(|w| !w.is_empty()) {
            let (key, val) = word.split_at(1);
            match key {
                "W" => w = val.parse::<u32>().ok(),
                "H" => h = val.parse::<u32>().ok(),
                "F" => {
                    f = val.split_once(':').and_then(|(n, d)| Some((n.parse::<u32>().ok()?, d.parse::<u32>().ok()?)))
                }
                "C" => {
                    c = match val {
                        "420" | "420jpeg" | "420paldv" | "420mpeg2" => Chroma::C420,
                        "422" => Chroma::C422,
                        "444" => Chroma::C444,
                        "mono" => Chroma::Mono,
                        other => return Err(bad(format!("colour space C{other} (8-bit 420, 422, 444, mono only)"))),
                    }
                }
                "I" => {
                    if val != "p" && val != "?" {
                        return Err(bad(format!("interlacing I{val} (progressive only)")));
                    }
                }
                // Aspect ratio and extensions change nothing here.
                "A" | "X" => {}
                other => return Err(bad(format!("unknown field {other}"))),
            }
        }
        let (Some(width), Some(height)) = (w, h) else { return Err(bad("missing W or H".into())) };
        if width == 0 || height == 0 || width > MAX_SIDE || height > MAX_SIDE {
            return Err(bad(format!("{width}x{height} pixels (1..{MAX_SIDE} each way)")));
        }
        if c == Chroma::C420 && (width % 2 != 0 || height % 2 != 0) {
            return Err(bad(format!("4:2:0 needs an even size, not {width}x{height}")));
        }
        let (fps_num, fps_den) = f.ok_or_else(|| bad("missing F".into()))?;
        if fps_num == 0 || fps_den == 0 {
            return Err(bad(format!("frame rate {fps_num}:{fps_den}")));
        }
        Ok(Y4mHeader { width, height, fps_num, fps_den, chroma: c })
    }

    /// Bytes of one frame's planes.
    pub fn frame_len(&self) -> usize {
        let y = self.width as usize * self.height as usize;
        match self.chroma {
            Chroma::C420 => y + 2 * (y / 4),
            Chroma::C422 => y + 2 * (y / 2),
            Chroma::C444 => 3 * y,
            Chroma::Mono => y,
        }
    }

    /// Nanoseconds per frame.
    pub fn frame_ns(&self) -> u64 {
        (1_000_000_000u64 * u64::from(self.fps_den)) / u64::from(self.fps_num)
    }
}

/// Reads frames of a Y4M stream.
#[derive(Debug)]
pub struct Y4mReader<R> {
    r: R,
    header: Y4mHeader,
    frame: u64,
}

fn read_line<R: BufRead>(r: &mut R, out: &mut Vec<u8>) -> io::Result<bool> {
    out.clear();
    let n = r.take(MAX_LINE as u64 + 1).read_until(b'\n', out)?;
    if n == 0 {
        return Ok(false);
    }
    if out.last() == Some(&b'\n') {
        out.pop();
        Ok(true)
    } else {
        Err(io::Error::new(io::ErrorKind::InvalidData, "a header line without its end"))
    }
}

impl<R: BufRead> Y4mReader<R> {
    /// Read and check the header.
    pub fn new(mut r: R) -> Result<Y4mReader<R>, Y4mError> {
        let mut line = Vec::new();
        match read_line(&mut r, &mut line) {
            Ok(true) => {}
            Ok(false) => return Err(Y4mError::Header("empty file".into())),
            Err(_) => return Err(Y4mError::Header("no header line".into())),
        }
        let header = Y4mHeader::parse(&line)?;
        Ok(Y4mReader { r, header, frame: 0 })
    }

    /// The header.
    pub fn header(&self) -> Y4mHeader {
        self.header
    }

    /// Frames read so far.
    pub fn frames_read(&self) -> u64 {
        self.frame
    }

    /// Read the next frame's planes into `buf` ([`Y4mHeader::frame_len`] bytes).
    /// `Ok(false)` at the end of the stream.
    pub fn read_frame(&mut self, buf: &mut [u8]) -> Result<bool, Y4mError> {
        let need = self.header.frame_len();
        assert!(buf.len() >= need, "a frame buffer of {} bytes, {need} needed", buf.len());
        let mut line = Vec::new();
        match read_line(&mut self.r, &mut line) {
            Ok(false) => return Ok(false),
            Ok(true) if line.starts_with(b"FRAME") && (line.len() == 5 || line[5] == b' ') => {}
            Ok(true) | Err(_) => return Err(Y4mError::FrameHeader { frame: self.frame }),
        }
        let mut got = 0;
        while got < need {
            match self.r.read(&mut buf[got..need]) {
                Ok(0) => return Err(Y4mError::Truncated { frame: self.frame, missing: need - got }),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.frame += 1;
        Ok(true)
    }
}

fn clamp(v: i32) -> u32 {
    v.clamp(0, 255) as u32
}

/// Convert one frame's planes (`src`, as read) to `0x00RRGGBB` little-endian pixels in
/// `dst` (`4 × width × height` bytes), BT.601 limited range.
pub fn yuv_to_rgb(h: &Y4mHeader, src: &[u8], dst: &mut [u8]) {
    let (w, ht) = (h.width as usize, h.height as usize);
    let ysize = w * ht;
    let (cw, ch) = chroma_size(h);
    let (yp, rest) = src[..h.frame_len()].split_at(ysize);
    let (up, vp) = rest.split_at(cw * ch);
    if w == 0 {
        return;
    }
    // Row by row over slices (no per-pixel division or index checks): at 1080p this is
    // the disk-read stage of the frame timing model, paid per frame by the player.
    for (y, (row, yrow)) in dst[..ysize * 4].chunks_exact_mut(w * 4).zip(yp.chunks_exact(w)).enumerate() {
        if cw == 0 {
            for (px, &l) in row.chunks_exact_mut(4).zip(yrow) {
                px.copy_from_slice(&pixel(l, 128, 128));
            }
            continue;
        }
        let cy = y * ch / ht;
        let (urow, vrow) = (&up[cy * cw..(cy + 1) * cw], &vp[cy * cw..(cy + 1) * cw]);
        if cw * 2 == w {
            for ((px2, l2), (&u, &v)) in row.chunks_exact_mut(8).zip(yrow.chunks_exact(2)).zip(urow.iter().zip(vrow)) {
                px2[..4].copy_from_slice(&pixel(l2[0], u, v));
                px2[4..].copy_from_slice(&pixel(l2[1], u, v));
            }
        } else if cw == w {
            for (((px, &l), &u), &v) in row.chunks_exact_mut(4).zip(yrow).zip(urow).zip(vrow) {
                px.copy_from_slice(&pixel(l, u, v));
            }
        } else {
            // An odd width under subsampled chroma: the general mapping.
            for (x, (px, &l)) in row.chunks_exact_mut(4).zip(yrow).enumerate() {
                let cx = x * cw / w;
                px.copy_from_slice(&pixel(l, urow[cx], vrow[cx]));
            }
        }
    }
}

/// The chroma planes' width and height.
fn chroma_size(h: &Y4mHeader) -> (usize, usize) {
    let (w, ht) = (h.width as usize, h.height as usize);
    match h.chroma {
        Chroma::C420 => (w / 2, ht / 2),
        Chroma::C422 => (w / 2, ht),
        Chroma::C444 => (w, ht),
        Chroma::Mono => (0, 0),
    }
}

/// One BT.601 limited-range pixel, `0x00RRGGBB` little-endian.
#[inline(always)]
fn pixel(l: u8, u: u8, v: u8) -> [u8; 4] {
    let c = 298 * (i32::from(l) - 16);
    let (u, v) = (i32::from(u) - 128, i32::from(v) - 128);
    let r = clamp((c + 409 * v + 128) >> 8);
    let g = clamp((c - 100 * u - 208 * v + 128) >> 8);
    let b = clamp((c + 516 * u + 128) >> 8);
    ((r << 16) | (g << 8) | b).to_le_bytes()
}

/// Write a Y4M header for `header` (4:2:0 only), for tools and tests that make clips.
pub fn write_header(out: &mut impl io::Write, h: &Y4mHeader) -> io::Result<()> {
    writeln!(out, "YUV4MPEG2 W{} H{} F{}:{} Ip A1:1 C420jpeg", h.width, h.height, h.fps_num, h.fps_den)
}

/// Convert `0x00RRGGBB` pixels to a 4:2:0 frame's planes (for making clips).
pub fn rgb_to_yuv420(w: usize, h: usize, rgb: &[u32], out: &mut Vec<u8>) {
    out.clear();
    let luma = |p: u32| {
        let (r, g, b) = (((p >> 16) & 255) as i32, ((p >> 8) & 255) as i32, (p & 255) as i32);
        (((66 * r + 129 * g + 25 * b + 128) >> 8) + 16) as u8
    };
    out.extend(rgb[..w * h].iter().map(|&p| luma(p)));
    let chroma = |p: u32, u: bool| {
        let (r, g, b) = (((p >> 16) & 255) as i32, ((p >> 8) & 255) as i32, (p & 255) as i32);
        let v = if u { (-38 * r - 74 * g + 112 * b + 128) >> 8 } else { (112 * r - 94 * g - 18 * b + 128) >> 8 };
        (v + 128).clamp(0, 255) as u8
    };
    for plane in [true, false] {
        for y in (0..h).step_by(2) {
            for x in (0..w).step_by(2) {
                out.push(chroma(rgb[y * w + x], plane));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conversion as first written, pixel by pixel: what the row-wise one must equal.
    fn reference(h: &Y4mHeader, src: &[u8]) -> Vec<u8> {
        let (w, ht) = (h.width as usize, h.height as usize);
        let (cw, ch) = chroma_size(h);
        let (yp, rest) = src.split_at(w * ht);
        let (up, vp) = rest.split_at(cw * ch);
        let mut out = Vec::new();
        for y in 0..ht {
            for x in 0..w {
                let (u, v) = if cw == 0 {
                    (128, 128)
                } else {
                    let (cx, cy) = (x * cw / w, y * ch / ht);
                    (up[cy * cw + cx], vp[cy * cw + cx])
                };
                out.extend_from_slice(&pixel(yp[y * w + x], u, v));
            }
        }
        out
    }

    proptest::proptest! {
        #[test]
        fn row_wise_conversion_equals_pixel_by_pixel(
            w in 1u32..40, ht in 1u32..30, c in 0usize..4, seed in proptest::prelude::any::<u64>()
        ) {
            let chroma = [Chroma::C420, Chroma::C422, Chroma::C444, Chroma::Mono][c];
            // The header parser refuses 4:2:0 with an odd side.
            let (w, ht) = if chroma == Chroma::C420 { (w * 2, ht * 2) } else { (w, ht) };
            let h = Y4mHeader { width: w, height: ht, fps_num: 25, fps_den: 1, chroma };
            let mut x = seed | 1;
            let src: Vec<u8> = (0..h.frame_len()).map(|_| { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x as u8 }).collect();
            let mut dst = vec![0xAAu8; w as usize * ht as usize * 4];
            yuv_to_rgb(&h, &src, &mut dst);
            proptest::prop_assert_eq!(dst, reference(&h, &src));
        }
    }

    fn clip(frames: usize, w: u32, h: u32) -> Vec<u8> {
        let hd = Y4mHeader { width: w, height: h, fps_num: 10, fps_den: 1, chroma: Chroma::C420 };
        let mut out = Vec::new();
        write_header(&mut out, &hd).unwrap();
        let mut planes = Vec::new();
        for k in 0..frames {
            let px: Vec<u32> =
                (0..(w * h) as usize).map(|i| if (i + k) % 2 == 0 { 0xff0000 } else { 0x0000ff }).collect();
            rgb_to_yuv420(w as usize, h as usize, &px, &mut planes);
            out.extend_from_slice(b"FRAME\n");
            out.extend_from_slice(&planes);
        }
        out
    }

    #[test]
    fn reads_frames_and_converts() {
        let data = clip(3, 4, 2);
        let mut r = Y4mReader::new(&data[..]).unwrap();
        assert_eq!(r.header().frame_ns(), 100_000_000);
        let mut buf = vec![0u8; r.header().frame_len()];
        let mut rgb = vec![0u8; 4 * 4 * 2];
        let mut n = 0;
        while r.read_frame(&mut buf).unwrap() {
            yuv_to_rgb(&r.header(), &buf, &mut rgb);
            n += 1;
        }
        assert_eq!(n, 3);
        // Luma survives; chroma is shared by 2x2 blocks, so colours blend but red
        // stays the strongest channel on a red pixel's block average of red and blue.
        let first = u32::from_le_bytes(rgb[0..4].try_into().unwrap());
        assert!(first <= 0xffffff);
    }

    #[test]
    fn headers_are_checked() {
        assert!(Y4mHeader::parse(b"YUV4MPEG2 W160 H120 F30000:1001 Ip A1:1 C420mpeg2 XYSCSS=420MPEG2").is_ok());
        for bad in [
            &b"YUV4MPEG W1 H1 F1:1"[..],
            b"YUV4MPEG2 W0 H10 F1:1",
            b"YUV4MPEG2 W10 H10 F1:0",
            b"YUV4MPEG2 W10 H10",
            b"YUV4MPEG2 W10 H10 F1:1 C420p10",
            b"YUV4MPEG2 W9 H10 F1:1",
            b"YUV4MPEG2 W10 H10 F1:1 It",
            b"YUV4MPEG2 W99999 H10 F1:1",
            b"YUV4MPEG2 W10 H10 F1:1 Q3",
        ] {
            assert!(Y4mHeader::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn truncated_files_say_so() {
        let data = clip(2, 4, 2);
        let cut = &data[..data.len() - 3];
        let mut r = Y4mReader::new(cut).unwrap();
        let mut buf = vec![0u8; r.header().frame_len()];
        assert!(r.read_frame(&mut buf).unwrap());
        match r.read_frame(&mut buf) {
            Err(Y4mError::Truncated { frame: 1, missing: 3 }) => {}
            other => panic!("{other:?}"),
        }
        let mut r = Y4mReader::new(&b"YUV4MPEG2 W2 H2 F1:1\nFRAMX\n"[..]).unwrap();
        assert!(matches!(r.read_frame(&mut buf), Err(Y4mError::FrameHeader { frame: 0 })));
        assert!(Y4mReader::new(&b""[..]).is_err());
        // A header line that never ends is refused without reading the whole file.
        let endless = vec![b'Y'; 1 << 20];
        assert!(Y4mReader::new(&endless[..]).is_err());
    }
}
