//! Tactus's record and report decoders (`ictus_tactus::proto`) on arbitrary bytes: a
//! tag, then a client record, a server reply and a socket frame.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ictus_tactus::proto::fuzz_one(data);
});
