//! The display server's request decoder (and the client's message decoder) on
//! arbitrary bytes: `ictus_display::proto::fuzz_batch` checks their promises.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ictus_display::proto::fuzz_batch(data);
});
