//! Fuzz the MARS volume label (the stripe table on disk, `ictus_mars::label`): decode
//! untrusted bytes; the checks are `ictus_mars::fuzz::label`'s.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ictus_mars::fuzz::label(data));
