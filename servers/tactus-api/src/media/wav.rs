//! WAV (RIFF `WAVE`, PCM): reading for `ictus play`, writing for the WAV sink.
//!
//! [`WavReader`] walks the chunks, checks the `fmt ` chunk (integer PCM, 8/16/24/32
//! bits, 1–32 channels, 1 kHz–384 kHz, or `WAVE_FORMAT_EXTENSIBLE` with a PCM
//! subformat) and finds `data`; samples come out as signed 16-bit little-endian
//! ([`WavReader::read_s16`]). A data chunk that claims more bytes than the file has is
//! refused at open (a truncated file), unless the writer left the size open
//! (`0xFFFFFFFF`, what streaming writers do), where the data runs to the end.
//!
//! [`WavWriter`] writes 16-bit PCM and fills in the sizes when finished.

use std::io::{self, Read, Seek, SeekFrom, Write};

/// Format of a WAV file's samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WavFormat {
    /// Frames per second.
    pub rate: u32,
    /// Channels.
    pub channels: u16,
    /// Bits per sample (8, 16, 24 or 32).
    pub bits: u16,
}

impl WavFormat {
    /// Bytes per frame (all channels).
    pub fn frame_bytes(&self) -> usize {
        usize::from(self.channels) * usize::from(self.bits / 8)
    }
}

/// Why a WAV file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WavError {
    /// Not a RIFF WAVE file, or a format we do not play.
    #[error("not a usable WAV file: {0}")]
    Format(String),
    /// The file is shorter than its chunks say.
    #[error("truncated WAV file: {0}")]
    Truncated(String),
    /// Reading failed.
    #[error("reading: {0}")]
    Io(#[from] io::Error),
}

/// Reads a WAV file's samples.
#[derive(Debug)]
pub struct WavReader<R> {
    r: R,
    format: WavFormat,
    /// Data bytes left.
    left: u64,
    data_len: u64,
    raw: Vec<u8>,
}

fn read_exact_or<R: Read>(r: &mut R, buf: &mut [u8], what: &str) -> Result<(), WavError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => WavError::Truncated(format!("the file ends inside {what}")),
        _ => WavError::Io(e),
    })
}

const EXTENSIBLE: u16 = 0xfffe;
/// The first two bytes of KSDATAFORMAT_SUBTYPE_PCM's GUID (the rest is the base GUID).
const PCM_GUID_TAIL: [u8; 14] = [0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xaa, 0x00, 0x38, 0x9b, 0x71];

impl<R: Read + Seek> WavReader<R> {
    /// Read the chunks up to the data and check the format.
    pub fn new(mut r: R) -> Result<WavReader<R>, WavError> {
        let file_len = r.seek(SeekFrom::End(0))?;
        r.seek(SeekFrom::Start(0))?;
        let mut riff = [0u8; 12];
        read_exact_or(&mut r, &mut riff, "the RIFF header")?;
        if &riff[0..4] != b"RIFF" || &riff[8..12] != b"WAVE" {
            return Err(WavError::Format("no RIFF/WAVE signature".into()));
        }
        let mut format = None;
        let mut pos = 12u64;
        for _ in 0..1024 {
            let mut ch = [0u8; 8];
            if pos + 8 > file_len {
                break;
            }
            read_exact_or(&mut r, &mut ch, "a chunk header")?;
            pos += 8;
            let id = [ch[0], ch[1], ch[2], ch[3]];
            let len = u64::from(u32::from_le_bytes(ch[4..8].try_into().expect("4")));
            match &id {
                b"fmt " => {
                    if !(16..=1024).contains(&len) {
                        return Err(WavError::Format(format!("a fmt chunk of {len} bytes")));
                    }
                    let mut f = vec![0u8; len as usize];
                    read_exact_or(&mut r, &mut f, "the fmt chunk")?;
                    pos += len;
                    let tag = u16::from_le_bytes([f[0], f[1]]);
                    let channels = u16::from_le_bytes([f[2], f[3]]);
                    let rate = u32::from_le_bytes(f[4..8].try_into().expect("4"));
                    let bits = u16::from_le_bytes([f[14], f[15]]);
                    let pcm = match tag {
                        1 => true,
                        EXTENSIBLE => f.len() >= 40 && f[26..40] == PCM_GUID_TAIL && f[24..26] == [1, 0],
                        _ => false,
                    };
                    if !pcm {
                        return Err(WavError::Format(format!("format tag {tag:#x} (integer PCM only)")));
                    }
                    if !matches!(bits, 8 | 16 | 24 | 32)
                        || !(1..=32).contains(&channels)
                        || !(1000..=384_000).contains(&rate)
                    {
                        return Err(WavError::Format(format!("{bits}-bit, {channels} channels, {rate} Hz")));
                    }
                    format = Some(WavFormat { rate, channels, bits });
                }
                b"data" => {
                    let Some(format) = format else {
                        return Err(WavError::Format("data before fmt".into()));
                    };
                    let avail = file_len - pos;
                    let data_len = if len == u64::from(u32::MAX) {
                        avail
                    } else if len > avail {
                        return Err(WavError::Truncated(format!(
                            "the data chunk claims {len} bytes, the file has {avail} after its header"
                        )));
                    } else {
                        len
                    };
                    let data_len = data_len - data_len % format.frame_bytes() as u64;
                    return Ok(WavReader { r, format, left: data_len, data_len, raw: Vec::new() });
                }
                _ => {
                    // Skip other chunks (padded to even lengths).
                    let skip = len + (len & 1);
                    if pos + skip > file_len {
                        return Err(WavError::Truncated(format!(
                            "a {:?} chunk runs past the end",
                            String::from_utf8_lossy(&id)
                        )));
                    }
                    r.seek(SeekFrom::Current(skip as i64))?;
                    pos += skip;
                }
            }
        }
        Err(WavError::Format("no data chunk".into()))
    }

    /// The format.
    pub fn format(&self) -> WavFormat {
        self.format
    }

    /// Frames in the data chunk.
    pub fn frames(&self) -> u64 {
        self.data_len / self.format.frame_bytes() as u64
    }

    /// Read up to `max_frames` frames as signed 16-bit little-endian samples into
    /// `out` (cleared first); returns frames read, 0 at the end.
    pub fn read_s16(&mut self, max_frames: usize, out: &mut Vec<u8>) -> Result<usize, WavError> {
        out.clear();
        let fb = self.format.frame_bytes();
        let n = (max_frames as u64).min(self.left / fb as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.raw.resize(n * fb, 0);
        read_exact_or(&mut self.r, &mut self.raw, "the data chunk")?;
        self.left -= (n * fb) as u64;
        let bps = usize::from(self.format.bits / 8);
        out.reserve(n * usize::from(self.format.channels) * 2);
        for s in self.raw.chunks_exact(bps) {
            let v: i16 = match bps {
                1 => (i16::from(s[0]) - 128) << 8,
                2 => i16::from_le_bytes([s[0], s[1]]),
                3 => i16::from_le_bytes([s[1], s[2]]),
                _ => i16::from_le_bytes([s[2], s[3]]),
            };
            out.extend_from_slice(&v.to_le_bytes());
        }
        Ok(n)
    }

    /// Go to frame `frame` (clamped to the end).
    pub fn seek_frame(&mut self, frame: u64) -> Result<(), WavError> {
        let fb = self.format.frame_bytes() as u64;
        let target = frame.saturating_mul(fb).min(self.data_len);
        let done = self.data_len - self.left;
        self.r.seek(SeekFrom::Current(target as i64 - done as i64))?;
        self.left = self.data_len - target;
        Ok(())
    }
}

/// Writes 16-bit PCM WAV; the sizes are filled in by [`WavWriter::finish`].
#[derive(Debug)]
pub struct WavWriter<W: Write + Seek> {
    w: W,
    data: u64,
}

impl<W: Write + Seek> WavWriter<W> {
    /// Start a file of `rate` Hz and `channels` channels.
    pub fn new(mut w: W, rate: u32, channels: u16) -> io::Result<WavWriter<W>> {
        let mut h = Vec::with_capacity(44);
        h.extend_from_slice(b"RIFF");
        h.extend_from_slice(&u32::MAX.to_le_bytes());
        h.extend_from_slice(b"WAVEfmt ");
        h.extend_from_slice(&16u32.to_le_bytes());
        h.extend_from_slice(&1u16.to_le_bytes());
        h.extend_from_slice(&channels.to_le_bytes());
        h.extend_from_slice(&rate.to_le_bytes());
        h.extend_from_slice(&(rate * u32::from(channels) * 2).to_le_bytes());
        h.extend_from_slice(&(channels * 2).to_le_bytes());
        h.extend_from_slice(&16u16.to_le_bytes());
        h.extend_from_slice(b"data");
        h.extend_from_slice(&u32::MAX.to_le_bytes());
        w.write_all(&h)?;
        Ok(WavWriter { w, data: 0 })
    }

    /// Append samples (16-bit little-endian, interleaved).
    pub fn write(&mut self, samples: &[u8]) -> io::Result<()> {
        self.w.write_all(samples)?;
        self.data += samples.len() as u64;
        Ok(())
    }

    /// Data bytes written.
    pub fn data_bytes(&self) -> u64 {
        self.data
    }

    /// Fill in the sizes and flush.
    pub fn finish(mut self) -> io::Result<W> {
        let data = u32::try_from(self.data).unwrap_or(u32::MAX);
        self.w.seek(SeekFrom::Start(4))?;
        self.w.write_all(&data.saturating_add(36).to_le_bytes())?;
        self.w.seek(SeekFrom::Start(40))?;
        self.w.write_all(&data.to_le_bytes())?;
        self.w.seek(SeekFrom::End(0))?;
        self.w.flush()?;
        Ok(self.w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn wav(frames: usize) -> Vec<u8> {
        let mut w = WavWriter::new(Cursor::new(Vec::new()), 8000, 2).unwrap();
        let s: Vec<u8> = (0..frames * 2).flat_map(|i| (i as i16).to_le_bytes()).collect();
        w.write(&s).unwrap();
        w.finish().unwrap().into_inner()
    }

    #[test]
    fn writes_and_reads_back() {
        let data = wav(100);
        let mut r = WavReader::new(Cursor::new(&data)).unwrap();
        assert_eq!(r.format(), WavFormat { rate: 8000, channels: 2, bits: 16 });
        assert_eq!(r.frames(), 100);
        let mut out = Vec::new();
        assert_eq!(r.read_s16(30, &mut out).unwrap(), 30);
        assert_eq!(i16::from_le_bytes([out[2], out[3]]), 1);
        r.seek_frame(90).unwrap();
        assert_eq!(r.read_s16(30, &mut out).unwrap(), 10);
        assert_eq!(i16::from_le_bytes([out[0], out[1]]), 180);
        assert_eq!(r.read_s16(30, &mut out).unwrap(), 0);
    }

    #[test]
    fn truncated_and_foreign_files_are_refused() {
        let data = wav(100);
        assert!(matches!(WavReader::new(Cursor::new(&data[..data.len() - 10])), Err(WavError::Truncated(_))));
        assert!(WavReader::new(Cursor::new(&data[..30])).is_err());
        let mut float = data.clone();
        float[20] = 3; // IEEE float
        assert!(matches!(WavReader::new(Cursor::new(&float)), Err(WavError::Format(_))));
        assert!(WavReader::new(Cursor::new(b"RIFX....WAVE")).is_err());
        assert!(WavReader::new(Cursor::new(Vec::<u8>::new())).is_err());
        // A streaming writer's open size: the data runs to the end of the file.
        let mut open = data.clone();
        open[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        open.truncate(open.len() - 4);
        let r = WavReader::new(Cursor::new(&open)).unwrap();
        assert_eq!(r.frames(), 99);
    }

    #[test]
    fn other_sample_sizes_become_16_bits() {
        let mut data = wav(4);
        // Rewrite as 8-bit mono of 16 frames: same bytes, other meaning.
        data[22] = 1; // channels
        data[34] = 8; // bits
        let mut r = WavReader::new(Cursor::new(&data)).unwrap();
        assert_eq!(r.frames(), 16);
        let mut out = Vec::new();
        r.read_s16(16, &mut out).unwrap();
        assert_eq!(out.len(), 32);
    }
}
