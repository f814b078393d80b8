//! The YUV4MPEG2 reader of `ictus play` (`ictus_tactus::media::y4m`) on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ictus_tactus::media::fuzz_y4m(data);
});
