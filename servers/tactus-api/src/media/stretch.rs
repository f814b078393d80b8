//! Audio at a rate other than 1: a block of `n` frames due over `d` of logical time
//! lasts `d / rate` of real time, so it is played as `n / rate` frames. Varispeed
//! (linear interpolation, as a tape played faster): the pitch moves with the rate.
//! Players that keep the pitch (scaletempo, WSOLA) need state across blocks and a
//! search per grain; see `doc/tactus.md` for why that is left out.

/// Stretch interleaved signed 16-bit little-endian `input` (`channels` per frame) to
/// `out_frames` frames into `out` (replaced), by linear interpolation between
/// neighbouring input frames. Integer arithmetic: the same bytes on every machine,
/// and `out_frames` equal to the input's frame count gives the input back. An input
/// without a whole frame, or no channels, gives silence of the asked length.
pub fn stretch_s16(input: &[u8], channels: usize, out_frames: usize, out: &mut Vec<u8>) {
    out.clear();
    let frame_bytes = channels.saturating_mul(2);
    let n = input.len().checked_div(frame_bytes).unwrap_or(0);
    out.resize(out_frames.saturating_mul(frame_bytes), 0);
    if n == 0 || out_frames == 0 {
        return;
    }
    let sample = |f: usize, c: usize| {
        let i = f * frame_bytes + 2 * c;
        i64::from(i16::from_le_bytes([input[i], input[i + 1]]))
    };
    let (n64, m64) = (n as u128, out_frames as u128);
    for j in 0..out_frames {
        // Output frame j sits at input position j·n/m: index and remainder over m.
        let num = j as u128 * n64;
        let at = (num / m64) as usize;
        let frac = (num % m64) as i64;
        let next = (at + 1).min(n - 1);
        for c in 0..channels {
            let (a, b) = (sample(at, c), sample(next, c));
            // frac < m, so the result lies between a and b: it fits an i16.
            let v = a + (b - a) * frac / out_frames as i64;
            let o = j * frame_bytes + 2 * c;
            out[o..o + 2].copy_from_slice(&(v as i16).to_le_bytes());
        }
    }
}

/// How many frames a block of `frames` plays as at `rate` (> 0), at least one.
pub fn stretched_len(frames: usize, rate: f64) -> usize {
    if !(rate.is_finite() && rate > 0.0) || frames == 0 {
        return frames;
    }
    ((frames as f64 / rate).round() as usize).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(v: &[i16]) -> Vec<u8> {
        v.iter().flat_map(|s| s.to_le_bytes()).collect()
    }

    fn samples(b: &[u8]) -> Vec<i16> {
        b.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]])).collect()
    }

    #[test]
    fn same_length_is_identity() {
        let input = frames(&[1, -2, 300, -32768, 32767, 0]);
        let mut out = Vec::new();
        stretch_s16(&input, 2, 3, &mut out);
        assert_eq!(out, input);
    }

    #[test]
    fn half_rate_interpolates_between_frames() {
        let input = frames(&[0, 100, 200, 300]);
        let mut out = Vec::new();
        stretch_s16(&input, 1, 8, &mut out);
        assert_eq!(samples(&out), vec![0, 50, 100, 150, 200, 250, 300, 300]);
    }

    #[test]
    fn double_rate_keeps_every_other_frame_per_channel() {
        let input = frames(&[0, 10, 1, 11, 2, 12, 3, 13]);
        let mut out = Vec::new();
        stretch_s16(&input, 2, 2, &mut out);
        assert_eq!(samples(&out), vec![0, 10, 2, 12]);
    }

    #[test]
    fn no_whole_frame_is_silence() {
        let mut out = vec![9u8; 3];
        stretch_s16(&[1, 2, 3], 2, 4, &mut out);
        assert_eq!(out, vec![0u8; 16]);
        stretch_s16(&[1, 2, 3, 4], 0, 4, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn lengths_follow_the_rate() {
        assert_eq!(stretched_len(480, 1.5), 320);
        assert_eq!(stretched_len(480, 0.25), 1920);
        assert_eq!(stretched_len(1, 4.0), 1);
        assert_eq!(stretched_len(480, f64::NAN), 480);
        assert_eq!(stretched_len(480, -1.0), 480);
    }

    proptest::proptest! {
        /// Every output sample lies within its channel's input range, and the output
        /// has the asked length.
        #[test]
        fn bounded_and_sized(v in proptest::collection::vec(proptest::num::i16::ANY, 0..64),
                             ch in 1usize..4, m in 0usize..200) {
            let input = frames(&v);
            let mut out = Vec::new();
            stretch_s16(&input, ch, m, &mut out);
            proptest::prop_assert_eq!(out.len(), m * ch * 2);
            let n = v.len() / ch;
            if n > 0 {
                let got = samples(&out);
                for c in 0..ch {
                    let col: Vec<i16> = (0..n).map(|f| v[f * ch + c]).collect();
                    let (lo, hi) = (*col.iter().min().unwrap(), *col.iter().max().unwrap());
                    for j in 0..m {
                        let s = got[j * ch + c];
                        proptest::prop_assert!(lo <= s && s <= hi);
                    }
                }
            }
        }
    }
}
