//! Fuzz the MARS server's HTTP request handling (`ictus_mars::http`): parse a request
//! head from untrusted bytes and plan the response; the checks are
//! `ictus_mars::fuzz::http_request`'s.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ictus_mars::fuzz::http_request(data));
