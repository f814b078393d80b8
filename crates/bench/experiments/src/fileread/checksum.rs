//! The checksum every method computes over what it read, and the pattern the test
//! file is written with: every run must read back exactly the bytes written.

use std::io;

use ictus_bench::BenchError;

/// A position-dependent checksum of a file's bytes that can be computed in pieces, in
/// any order: the wrapping sum of the file's little-endian 64-bit words, and the
/// wrapping sum of each word xored with a mix of its index. The last word, if partial,
/// is padded with zeros. Cheap enough (a few adds per word) not to hide the read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checksum {
    sum: u64,
    mixed: u64,
    len: u64,
}

const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

impl Checksum {
    /// Adds the bytes found at byte `offset` of the file. `offset` must be a multiple
    /// of 8, and `data.len()` too unless `data` ends the file.
    pub fn add_at(&mut self, offset: u64, data: &[u8]) {
        debug_assert_eq!(offset % 8, 0, "checksum pieces start on a word");
        let mut key = (offset / 8).wrapping_mul(MIX);
        let (mut sum, mut mixed) = (0u64, 0u64);
        let mut words = data.chunks_exact(8);
        for word in &mut words {
            let w = u64::from_le_bytes([word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7]]);
            sum = sum.wrapping_add(w);
            mixed = mixed.wrapping_add(w ^ key);
            key = key.wrapping_add(MIX);
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            let w = u64::from_le_bytes(last);
            sum = sum.wrapping_add(w);
            mixed = mixed.wrapping_add(w ^ key);
        }
        self.sum = self.sum.wrapping_add(sum);
        self.mixed = self.mixed.wrapping_add(mixed);
        self.len += data.len() as u64;
    }

    /// Bytes summed.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was summed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A [`Checksum`] fed the file's bytes in order, in pieces of any length.
#[derive(Debug, Clone, Default)]
pub struct StreamChecksum {
    sum: Checksum,
    offset: u64,
    carry: [u8; 8],
    carried: usize,
}

impl StreamChecksum {
    /// An empty checksum at offset 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the next bytes of the file.
    pub fn update(&mut self, mut data: &[u8]) {
        if self.carried > 0 {
            let take = (8 - self.carried).min(data.len());
            self.carry[self.carried..self.carried + take].copy_from_slice(&data[..take]);
            self.carried += take;
            data = &data[take..];
            if self.carried < 8 {
                return;
            }
            self.sum.add_at(self.offset, &self.carry);
            self.offset += 8;
            self.carried = 0;
        }
        let whole = data.len() / 8 * 8;
        self.sum.add_at(self.offset, &data[..whole]);
        self.offset += whole as u64;
        let rest = &data[whole..];
        self.carry[..rest.len()].copy_from_slice(rest);
        self.carried = rest.len();
    }

    /// The checksum of everything added.
    pub fn finish(mut self) -> Checksum {
        if self.carried > 0 {
            self.sum.add_at(self.offset, &self.carry[..self.carried]);
        }
        self.sum
    }
}

/// Fails unless a run's checksum is the file's.
pub(super) fn check_checksum(case: &str, expected: Checksum, got: Checksum) -> Result<(), BenchError> {
    if got == expected {
        Ok(())
    } else {
        Err(BenchError::io(
            format!("{case}: read data differs from the file written"),
            io::Error::other(format!("checksum {got:x?}, expected {expected:x?}")),
        ))
    }
}

/// The test file's content at `offset` (a multiple of 8; `buf.len()` too): one
/// splitmix64 word per 8 bytes, so it neither compresses nor repeats.
pub(super) fn fill_pattern(buf: &mut [u8], offset: u64, seed: u64) {
    let first = offset / 8;
    for (i, word) in buf.chunks_exact_mut(8).enumerate() {
        let mut z = seed.wrapping_add((first + i as u64).wrapping_mul(MIX));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        word.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        let mut data = vec![0u8; len.div_ceil(8) * 8];
        fill_pattern(&mut data, 0, 7);
        data.truncate(len);
        data
    }

    fn one_shot(data: &[u8]) -> Checksum {
        let mut sum = Checksum::default();
        sum.add_at(0, data);
        sum
    }

    #[test]
    fn checksum_pieces_in_any_order_agree() {
        let data = pattern(10_003);
        let whole = one_shot(&data);
        assert_eq!(whole.len(), 10_003);

        // In order, in pieces of awkward lengths.
        let mut stream = StreamChecksum::new();
        let mut rest = &data[..];
        for size in [1usize, 3, 7, 8, 9, 1024, 5, 4096].iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let n = (*size).min(rest.len());
            stream.update(&rest[..n]);
            rest = &rest[n..];
        }
        assert_eq!(stream.finish(), whole);

        // Word-aligned pieces, last first (as io_uring completions may come).
        let mut backwards = Checksum::default();
        let chunks: Vec<(usize, &[u8])> = data.chunks(1000).enumerate().map(|(i, c)| (i * 1000, c)).collect();
        for (offset, chunk) in chunks.into_iter().rev() {
            backwards.add_at(offset as u64, chunk);
        }
        assert_eq!(backwards, whole);
        assert!(Checksum::default().is_empty());
        assert_eq!(StreamChecksum::new().finish(), Checksum::default());
    }

    #[test]
    fn checksum_sees_content_position_and_length() {
        let data = pattern(4096);
        let whole = one_shot(&data);
        let mut swapped = data.clone();
        swapped[..8].copy_from_slice(&data[8..16]);
        swapped[8..16].copy_from_slice(&data[..8]);
        assert_ne!(one_shot(&swapped), whole, "reordered words");
        let mut flipped = data.clone();
        flipped[1000] ^= 0x10;
        assert_ne!(one_shot(&flipped), whole, "one bit");
        let mut longer = data.clone();
        longer.push(0);
        assert_ne!(one_shot(&longer), whole, "a trailing zero byte");
    }

    #[test]
    fn a_mismatch_fails_the_experiment() {
        let good = one_shot(&pattern(64));
        assert!(check_checksum("stdio 1 KiB cached", good, good).is_ok());
        let err = check_checksum("mapped uncached", good, one_shot(&pattern(56))).expect_err("mismatch");
        assert!(err.to_string().contains("mapped uncached"), "{err}");
    }

    #[test]
    fn the_pattern_does_not_depend_on_how_it_is_cut() {
        let mut whole = vec![0u8; 4096];
        fill_pattern(&mut whole, 0, 42);
        let mut pieces = vec![0u8; 4096];
        for (i, chunk) in pieces.chunks_mut(512).enumerate() {
            fill_pattern(chunk, i as u64 * 512, 42);
        }
        assert_eq!(whole, pieces);
        let mut other = vec![0u8; 4096];
        fill_pattern(&mut other, 0, 43);
        assert_ne!(whole, other, "the seed matters");
    }
}
