//! The WAV reader of `ictus play` (`ictus_tactus::media::wav`) on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ictus_tactus::media::fuzz_wav(data);
});
