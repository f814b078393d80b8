//! Uncompressed media files a Tactus client reads from disk: YUV4MPEG2 video and WAV
//! audio (Standard MIDI Files are `ictus_midi::smf`'s). Checked parsers over untrusted
//! bytes, fuzzed (`fuzz/fuzz_targets/tactus_y4m.rs`, `tactus_wav.rs`).

pub mod stretch;
pub mod wav;
pub mod y4m;

/// The Y4M reader on arbitrary bytes, for the fuzz target: reads every frame (a few
/// at most, bounded by the input) and converts each. Returns the frames read.
pub fn fuzz_y4m(data: &[u8]) -> usize {
    let Ok(mut r) = y4m::Y4mReader::new(data) else { return 0 };
    let h = r.header();
    // Keep the fuzzer's memory small: a frame cannot be larger than the input anyway.
    if h.frame_len() > data.len() {
        return 0;
    }
    let mut buf = vec![0u8; h.frame_len()];
    let mut rgb = vec![0u8; h.width as usize * h.height as usize * 4];
    let mut n = 0;
    while let Ok(true) = r.read_frame(&mut buf) {
        y4m::yuv_to_rgb(&h, &buf, &mut rgb);
        n += 1;
    }
    n
}

/// The WAV reader on arbitrary bytes, for the fuzz target: reads all samples and
/// seeks. Returns the frames read.
pub fn fuzz_wav(data: &[u8]) -> usize {
    let Ok(mut r) = wav::WavReader::new(std::io::Cursor::new(data)) else { return 0 };
    let mut out = Vec::new();
    let mut n = 0;
    while let Ok(k) = r.read_s16(4096, &mut out) {
        if k == 0 {
            break;
        }
        n += k;
    }
    let _ = r.seek_frame(u64::MAX / 2);
    let _ = r.seek_frame(1);
    n
}
